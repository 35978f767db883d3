"""The fast path: what makes a client that repeats its request cheap to serve
(docs/fast-path.md).

A client usually sends the same model, inputs and outputs again and again, and only the tensor
bytes change. The fast path takes advantage of that, and of nothing else: every request it
does not recognise goes the normal way, and the normal path reads the same without it. The
transports, the lifecycle and dispatch call it at a few named places, each marked as the fast
path.

- request_templates.py: a request whose non-tensor part repeats byte for byte is decoded once,
  into a request template, and filled with each request's tensors (the transports' codecs).
- checked_templates.py: a template's later requests are admitted by their tensors' lengths
  (the dataplane's admission, lifecycle.Lifecycle.admit).
- prepared_answers.py, answer_loan.py, connection_loans.py, worker_loans.py: the model's worker
  writes the answer to the client itself, with the bytes the transport prepared.

One vocabulary, used everywhere for the last of these:
- a prepared answer: a request's answer to its client, made before the model runs, but for
  the outputs' bytes (PreparedAnswer; its layout, AnswerLayout, comes from the transport's
  codec, the only one that knows its wire format);
- a loan: the client's socket, lent to the worker with the batch (lend), until the worker
  has returned it (returned) or died while it wrote (lost); a connection's loans are kept
  by ConnectionLoans, a worker's by WorkerLoans, and AnswerLoan is all dispatch sees of one;
- written by the worker: the answer the worker wrote (the responses' `written_by_worker`,
  the worker's Written frame, WRITTEN_BY_WORKER for the transports' handlers).

Its modules serve different layers, and each sits in the layer of what it serves
(tests/unit/test_layering.py); none imports a transport. This package's own module imports
nothing.
"""
