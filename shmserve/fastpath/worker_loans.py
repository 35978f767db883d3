"""The loans of clients' sockets to one model worker, for the answers it writes itself
(docs/fast-path.md): dispatch's side of the answer loan (answer_loan.py).

A request may carry a prepared answer (WorkRequest.prepared_answer, an AnswerLoan): its
client's socket is lent to the worker with the batch (SCM_RIGHTS over a socket pair of its
own, `open`), and the worker then writes the answer itself (workers/prepared_answers.py). The
worker says which answers it writes in the batch's Result; it writes them after the Result,
and says what it did not write (a Written frame, or a note on its next Result). Until then
the answers' connections are the worker's: the front writes nothing to them. Answers the
worker does not write, or that cannot be lent, are returned to the front, which answers them.
"""

import socket
from typing import Optional

from shmserve.ipc import messages


class WorkerLoans:
    def __init__(self, holder):
        """`holder`: whom the sockets are lent to, as the connections know it (the
        instance's WorkerHandle, whose batches write in turn)."""
        self._holder = holder
        # The front's end of the socket that lends clients' sockets to the worker.
        self._lender: Optional[socket.socket] = None
        # batch id -> [(index, answer)] of the answers the worker is writing after its Result.
        self._writing: dict = {}

    def open(self) -> socket.socket:
        """A new process's socket pair; the worker's end is returned, to be handed to it (and
        closed here once it is)."""
        self.close()
        lender, lent = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        lender.setblocking(False)  # full means the worker is behind: the front answers then
        self._lender = lender
        return lent

    def close(self) -> None:
        if self._lender is not None:
            self._lender.close()
            self._lender = None

    def lend(self, batch_id: int, batch: list) -> tuple[Optional[list], list]:
        """Send the worker the client sockets of the batch's prepared answers. Returns, per
        request, the index of its socket among those sent, or -1 when the worker may not
        answer it (None when none may); and the requests whose answers were lent, as
        (index in the batch, answer)."""
        if self._lender is None:
            return None, []
        fds: list[int] = []
        index_of: dict[int, int] = {}  # descriptor -> its index in fds: an HTTP/2 connection is sent once
        sockets = []
        lent = []
        for i, req in enumerate(batch):
            answer = req.prepared_answer
            fd = answer.lend(self._holder) if answer is not None else -1
            if fd < 0:
                sockets.append(-1)
                continue
            index = index_of.get(fd)
            if index is None:
                index = index_of[fd] = len(fds)
                fds.append(fd)
            sockets.append(index)
            lent.append((i, answer))
        if not lent:
            return None, []
        if len(fds) > messages.MAX_LENT_SOCKETS:  # the front answers a larger one
            return_unwritten(lent)
            return None, []
        try:
            socket.send_fds(self._lender, [batch_id.to_bytes(8, "little")], fds)
        except OSError:  # the worker is behind, or gone: the front answers these
            return_unwritten(lent)
            return None, []
        return sockets, lent

    def answered(self, batch_id: int, lent: list, responses: list) -> None:
        """The batch's Result came, with `responses` (its ResponseFrames, none for a decoupled
        model's): the answers the worker writes wait for its word; the others are the
        front's."""
        writing = []
        for index, answer in lent:
            if responses and responses[index].written_by_worker:
                writing.append((index, answer))
            else:
                answer.returned(None)  # the front answers it
        if writing:
            self._writing[batch_id] = writing

    def written(self, batch_id: int, unsent: list) -> None:
        """The worker wrote the batch's answers, all but `unsent` ([index, bytes] pairs)."""
        writing = self._writing.pop(batch_id, None)
        if writing is not None:
            rest = dict(unsent)  # written first: before anything else is written
            for index, answer in writing:
                answer.returned(rest.get(index, b""))

    def lost(self, whole: int) -> None:
        """The worker died before it said what it wrote: the answers of batch `whole` (which
        it marked written whole in the request table) were, the others may be cut short."""
        writing, self._writing = self._writing, {}
        for batch_id, lent in writing.items():
            for _, answer in lent:
                if batch_id == whole:
                    answer.returned(b"")
                else:
                    answer.lost()


def return_unwritten(lent: list) -> None:
    """The worker writes none of these lent answers: the front answers them."""
    for _, answer in lent:
        answer.returned(None)
