"""The answer loan: what dispatch knows of a request whose model's worker may write the answer
to the client itself (docs/fast-path.md).

A work request may carry a prepared answer (WorkRequest.prepared_answer): its answer to its
client, prepared by the transport up to the outputs' bytes. Dispatch lends the client's socket
to the worker that runs the request's batch (worker_loans.py); the worker writes the answer if
the model's response is the one the answer was prepared for, and the loan ends, one way or the
other. This protocol is all dispatch sees of it; fastpath/prepared_answers.PreparedAnswer is
the transports' implementation.
"""

from typing import Optional, Protocol


class AnswerLoan(Protocol):
    """A request's prepared answer, as lent with its batch. The contract:

    - `lend(holder)` is called once, as the batch is sent. It returns the descriptor of the
      client's socket, lent to the worker `holder` (its WorkerHandle, whose batches write in
      turn), or -1 when the answer cannot be written there now: the transport then answers as
      usual, and nothing else is called.
    - Once `lend` gave a socket, `frame` is what the worker writes (messages.RequestFrame's
      prepared answer, without the socket's index), and exactly one of `returned` or `lost`
      follows.
    - `returned(None)`: the worker did not write the answer (another response than the one
      prepared, the batch failed or could not be sent); the transport answers as usual.
    - `returned(unsent)`: the worker wrote the answer, after the batch's Result; `unsent` is
      what the socket did not take of it (b"" when it took it all), for the transport to write
      before anything else. Until then the transport writes nothing to the socket itself.
    - `lost()`: the worker died after the batch's Result, before it said what it wrote, and
      had not marked the batch's answers whole (ipc/request_table.py): the client may hold
      part of the answer, so the connection closes.
    """

    frame: Optional[list]

    def lend(self, holder) -> int:
        ...

    def returned(self, unsent: Optional[bytes]) -> None:
        ...

    def lost(self) -> None:
        ...
