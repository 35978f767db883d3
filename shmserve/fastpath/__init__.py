"""The fast path: what makes a client that repeats its request cheap to serve
(docs/fast-path.md).

A client usually sends the same model, inputs and outputs again and again, and only the tensor
bytes change. The fast path takes advantage of that, and of nothing else: every request it
does not recognise goes the normal way, and the normal path reads the same without it.

- request_templates.py: a request whose non-tensor part repeats byte for byte is decoded once,
  into a request template, and filled with each request's tensors (the transports' codecs).
- checked_templates.py: a template's later requests are admitted by their tensors' lengths
  (the dataplane's admission, lifecycle.Lifecycle.admit).

Its modules serve different layers, and each sits in the layer of what it serves
(tests/unit/test_layering.py); none imports a transport. This package's own module imports
nothing.
"""
