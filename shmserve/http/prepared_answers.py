"""Infer answers prepared before the model runs, for the model's worker to write.

A client that repeats a request (perf_analyzer does, as do most clients of one model: the same
JSON header, new tensor bytes) gets answers that differ only in the outputs' bytes. So each
connection keeps the head and JSON header of the last answer it wrote for such a request,
keyed by what decided them: the request's template (request_templates.py), which stands for
its model, version and JSON header. The next request on the connection from the same template
takes them along as its prepared answer. If the model's
response has the same outputs (names, datatypes, shapes) and nothing else, the model's worker
writes the prepared bytes and the outputs' bytes to the client's socket itself, and the front
only keeps its accounts (workers/answers.py): writing answers is the largest single cost of
the front's one thread, and the worker is mostly idle.

Only answers whose outputs all follow the JSON header as binary data are prepared: every other
answer puts what the outputs hold into the JSON header.
"""

from shmserve.inference import InferResponse


class PreparedAnswer:
    """What WorkRequest.answer asks for (dispatch.work_types.PreparedAnswer)."""

    __slots__ = ("model_version", "frame", "_connection")

    def __init__(self, model_version: str, frame: list, connection):
        self.model_version = model_version  # the version the JSON header names
        self.frame = frame  # ipc.messages.RequestFrame.answer
        self._connection = connection

    def lend(self, holder) -> int:
        return self._connection.lend_socket(holder)

    def returned(self, unsent) -> None:
        self._connection.answer_returned(unsent)

    def lost(self) -> None:
        self._connection.answer_lost()


class AnswerBook:
    """A connection's last prepared answer."""

    __slots__ = ("_key", "_version", "_frame")

    def __init__(self):
        self._key = None
        self._version = ""
        self._frame = None

    def lookup(self, key, connection) -> PreparedAnswer | None:
        if key is not self._key:
            return None
        return PreparedAnswer(self._version, self._frame, connection)

    def learn(self, key, head: bytes, chunks: list, response: InferResponse) -> None:
        """Keep the answer just built (`head`, then `chunks`: the JSON header and each
        output's bytes) for requests with `key`, if its outputs all followed as binary data
        of a fixed size, and nothing in it depends on more than their names, datatypes and
        shapes."""
        outputs = response.outputs
        if response.parameters or len(chunks) != len(outputs) + 1 \
                or any(o.parameters or o.datatype == "BYTES" for o in outputs):
            self._key = None
            return
        self._key = key
        self._version = response.model_version
        self._frame = [[head + chunks[0], *(b"" for _ in outputs)],
                       [[o.name, o.datatype, list(o.shape), memoryview(chunk).nbytes]
                        for o, chunk in zip(outputs, chunks[1:])]]
