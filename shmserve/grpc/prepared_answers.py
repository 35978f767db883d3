"""gRPC infer answers prepared before the model runs, for the model's worker to write: the
gRPC side of what shmserve/http/prepared_answers.py does for HTTP.

A unary ModelInfer answer is three HTTP/2 frames on its stream: HEADERS, one DATA frame with
the length-prefixed ModelInferResponse, and the trailers. A client that repeats a request
(same fields but the tensor bytes, so the same request template, request_templates.py) gets
answers that differ only in the stream id and the outputs' bytes. So each connection keeps the
layout of the last such message it sent, and the next request from the same template takes it
along. When the connection can lend its socket (transport._Connection.lend_answer), the model's
worker writes the frames and the outputs' bytes itself (workers/answers.py), all of a batch's
answers on the connection in one write; the connection holds what else it would write until
the batch is over.
"""

from shmserve.grpc import codec


class PreparedAnswer:
    """What WorkRequest.answer asks for (dispatch.work_types.PreparedAnswer)."""

    __slots__ = ("model_version", "frame", "_call", "_layout")

    def __init__(self, model_version: str, layout: tuple, call):
        self.model_version = model_version  # the version the message names
        self.frame = None  # set when lent: its frames depend on the stream
        self._call = call
        self._layout = layout

    def lend(self, holder) -> int:
        pieces, size, expected = self._layout
        lent = self._call.conn.lend_answer(self._call, holder, size)
        if lent is None:
            return -1
        fd, before, after = lent
        framed = list(pieces)
        framed[0] = before + framed[0]
        framed[-1] = framed[-1] + after
        self.frame = [framed, expected]
        return fd

    def returned(self, unsent) -> None:
        self._call.conn.answer_returned(self._call, unsent)

    def lost(self) -> None:
        self._call.conn.answer_lost()


class AnswerBook:
    """A connection's last prepared message."""

    __slots__ = ("_key", "_version", "_layout")

    def __init__(self):
        self._key = None
        self._version = ""
        self._layout = None

    def lookup(self, key, call) -> PreparedAnswer | None:
        if key is None or key is not self._key:
            return None
        return PreparedAnswer(self._version, self._layout, call)

    def learn(self, key, response) -> None:
        """Keep the layout of `response`'s message for requests with `key` (their template),
        if it depends on nothing but its outputs' names, datatypes and shapes."""
        layout = codec.prepared_message(response) if key is not None else None
        self._key = key if layout is not None else None
        self._version = response.model_version
        self._layout = layout
