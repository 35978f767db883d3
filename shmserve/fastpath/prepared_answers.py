"""Prepared answers: a request's answer to its client, made before the model runs, up to the
outputs' bytes, for the model's worker to write (docs/fast-path.md).

A client that repeats a request (the same JSON header or gRPC fields, new tensor bytes, so the
same request template) gets answers that differ only in the outputs' bytes (and, over gRPC,
the stream id). So each connection keeps the layout of its last infer answer
(connection_loans.ConnectionLoans), and the next request from the same template takes it
along as its prepared answer. Writing answers is the largest single cost of the front's one
thread, and the worker, which holds the outputs when its batch ends, is mostly idle: when the
model's response has the outputs the layout announces, the worker writes the answer
(workers/prepared_answers.py) and the transport only keeps its accounts.

The layouts are made by the transports' codecs (http/codec.py, grpc/codec.py), which alone know
their wire formats: a layout must be byte for byte what the codec writes for such a response.
"""

from typing import NamedTuple


class AnswerLayout(NamedTuple):
    """An answer's bytes around its outputs': the answer is pieces[0], output 0, pieces[1],
    ..., output n-1, pieces[n]. `size`: its length, outputs included; `expected`: [name,
    datatype, shape, nbytes] of each output, which the model's response must match."""

    pieces: list
    size: int
    expected: list


class PreparedAnswer:
    """One request's prepared answer, on one stream of its connection (a gRPC call; None over
    HTTP/1.1): the answer_loan.AnswerLoan its work request carries. Lending it lends the
    connection's socket (ConnectionLoans.lend), which frames the answer for its stream."""

    __slots__ = ("model_version", "frame", "_layout", "_loans", "_stream")

    def __init__(self, model_version: str, layout: AnswerLayout, loans, stream):
        self.model_version = model_version  # the version the answer names
        self.frame: list | None = None  # set when lent: its framing may depend on the stream
        self._layout = layout
        self._loans = loans  # its connection's ConnectionLoans
        self._stream = stream

    def lend(self, holder) -> int:
        pieces, size, expected = self._layout
        lent = self._loans.lend(holder, self._stream, size)
        if lent is None:
            return -1
        fd, before, after = lent
        if before or after:
            pieces = list(pieces)
            pieces[0] = before + pieces[0]
            pieces[-1] = pieces[-1] + after
        self.frame = [pieces, expected]
        return fd

    def returned(self, unsent: bytes | None) -> None:
        self._loans.returned(self._stream, unsent)

    def lost(self) -> None:
        self._loans.lost()


def for_work(answer: PreparedAnswer, work, mv) -> PreparedAnswer | None:
    """`answer`, for the work request `work` to model version `mv` to carry, or None when the
    front must answer: a traced request (the trace stamps when the front sends the answer), a
    model whose responses the front changes or orders (ModelVersion.answers_in_worker), or
    another version than the one the answer names."""
    if work.trace is None and mv.answers_in_worker \
            and answer.model_version == str(mv.version):
        return answer
    return None


# What a transport's infer handler returns when the model's worker wrote the answer (the
# response's `written_by_worker`): its connection has nothing to write.
WRITTEN_BY_WORKER = object()
