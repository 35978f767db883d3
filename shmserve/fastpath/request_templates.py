"""Decoding a repeated request once.

A client sends the same model, inputs and outputs again and again, and only the tensor bytes
change: the part of the request that holds the rest (a gRPC request's fields before
raw_input_contents, an HTTP request's JSON header) is byte for byte the same. The transports
key a RequestTemplate with those bytes and fill it with each request's tensor bytes, rather
than parse and check them again.
"""

from shmserve.inference import InferRequest, InputTensor, RequestedOutput

# Longer heads are parsed every time: a long one is mostly tensor values given inline (typed
# contents, JSON data), which no two requests share, and copying and hashing it would be waste.
MAX_KEY_BYTES = 4096


class BoundedCache(dict):
    """A dict of at most `limit` entries, emptied when full: a client that varies what keys
    it (an id per request) costs a miss per request, never memory."""

    def __init__(self, limit: int = 64):
        super().__init__()
        self.limit = limit

    def put(self, key, value) -> None:
        if len(self) >= self.limit:
            self.clear()
        self[key] = value


class RequestTemplate:
    """What a request decodes to, but its tensor bytes; `fill` gives each request its own
    copies of what the server may change (parameters, shapes)."""

    __slots__ = ("model_name", "model_version", "id", "parameters", "inputs", "outputs",
                 "checked")

    def __init__(self, request: InferRequest):
        self.model_name = request.model_name
        self.model_version = request.model_version
        self.id = request.id
        self.parameters = dict(request.parameters)
        self.inputs = [(t.name, t.datatype, list(t.shape), dict(t.parameters))
                       for t in request.inputs]
        self.outputs = [(o.name, dict(o.parameters)) for o in request.outputs]
        # What the dataplane found when it checked a request of this template against a
        # model, for the next ones (checked_templates.CheckedTemplate).
        self.checked = None

    def fill(self, data: list) -> InferRequest:
        """The request with `data[i]` as input i's bytes (None: in a shared-memory region)."""
        inputs = [InputTensor(name, datatype, shape.copy(), tensor,
                              params.copy() if params else {})
                  for (name, datatype, shape, params), tensor in zip(self.inputs, data)]
        outputs = [RequestedOutput(name, params.copy() if params else {})
                   for name, params in self.outputs]
        request = InferRequest(self.model_name, self.model_version, self.id,
                               self.parameters.copy() if self.parameters else {}, inputs,
                               outputs)
        request.template = self
        return request
