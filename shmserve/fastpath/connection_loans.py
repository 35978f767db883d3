"""A client connection's part in the fast path's answers: the layout of its last answer, and
the loans of its socket to model workers (docs/fast-path.md).

Both transports' connections hold one ConnectionLoans (http/http1_connection.py,
grpc/connection.py). It keeps what is the same for both: which worker has the socket, how many
answers it holds, whether the socket ever refused part of one (then no more loans), and what
the next request of the same template takes along (prepared_answers.PreparedAnswer). What
differs, it asks of the connection through LoanHooks (http/http1_loans.py, grpc/loans.py): how
an answer is framed on its stream, how the connection holds its own writes meanwhile, and what
it does when the loans end.

A connection is lent to one worker at a time, whose batches write in turn (a client often sends
its next request before the front has heard that the worker wrote the last answer); its loans
end when the worker has returned every answer it was lent.
"""

from typing import Optional, Protocol

from shmserve.fastpath.prepared_answers import AnswerLayout, PreparedAnswer


class LoanHooks(Protocol):
    """What a connection does as its socket is lent and comes back (its protocol's part).
    `stream`: the connection's handle on one answer (a gRPC call; None over HTTP/1.1)."""

    def lend_stream(self, stream, size: int, first: bool) -> Optional[tuple[bytes, bytes]]:
        """Make `stream`'s answer, `size` bytes, the worker's to write: the bytes its protocol
        puts before the answer and after it, or None when the answer cannot go to the socket
        now (this side has bytes of its own to write first, say). `first`: no other answer
        is lent, so this side starts holding what it writes."""

    def stream_returned(self, stream, written: bool) -> None:
        """The worker is done with `stream`'s answer, which it wrote, or left to this side."""

    def write_now(self, data: bytes) -> None:
        """Write `data` to the socket at once, before anything this side holds."""

    def loans_over(self) -> None:
        """The last lent answer is back: what this side held goes out."""

    def loan_lost(self, last: bool) -> None:
        """A worker died while it wrote an answer: the client may hold part of it, so the
        connection closes. `last`: no other answer is lent."""


class ConnectionLoans:
    """One client connection's loans, and the prepared answer its next request may take."""

    __slots__ = ("fd", "lent", "holder", "backed_up", "_hooks", "_key", "_version", "_layout")

    def __init__(self, hooks: LoanHooks):
        self.fd = -1  # the socket's descriptor, once the connection may lend it (not TLS)
        self.lent = 0  # answers lent and not yet returned
        self.holder = None  # the worker they are lent to
        # The socket once took only part of a worker's answer: never lent again, so that no
        # worker writes while this side still has the rest to write.
        self.backed_up = False
        self._hooks = hooks
        # The last answer's layout, and the key (the request template) that decided it.
        self._key = None
        self._version = ""
        self._layout: Optional[AnswerLayout] = None

    @property
    def lendable(self) -> bool:
        """Whether the socket may be lent at all (the connection may know more reasons not)."""
        return self.fd >= 0 and not self.backed_up

    # The connection's last answer
    def prepared(self, key, stream) -> Optional[PreparedAnswer]:
        """The prepared answer of a request with `key` (its request template) on `stream`:
        the last answer's layout, when it was for the same key."""
        layout = self._layout
        if key is None or key is not self._key or layout is None:
            return None
        return PreparedAnswer(self._version, layout, self, stream)

    def learn(self, key, version: str, layout: Optional[AnswerLayout]) -> None:
        """Keep the layout of the answer just written for a request with `key`, which names
        model version `version`; None: that answer cannot be prepared (its bytes depend on
        more than its outputs' names, datatypes and shapes), so none is kept."""
        self._key = key if layout is not None else None
        self._version = version
        self._layout = layout

    # The loans
    def lend(self, holder, stream, size: int) -> Optional[tuple[int, bytes, bytes]]:
        """Lend the socket for `stream`'s answer of `size` bytes to the worker `holder`: (the
        socket's descriptor, the bytes before the answer and after it), or None when it
        cannot be lent now."""
        if self.fd < 0 or self.backed_up or (self.lent and holder != self.holder):
            return None
        framing = self._hooks.lend_stream(stream, size, not self.lent)
        if framing is None:
            return None
        self.lent += 1
        self.holder = holder
        return self.fd, framing[0], framing[1]

    def returned(self, stream, unsent: Optional[bytes]) -> None:
        """The worker is done with `stream`'s answer: `unsent` is what the socket did not take
        of it (written at once: the worker writes no more to a socket that left some), or None
        when the worker did not write it. The last one back ends the loans."""
        self._hooks.stream_returned(stream, unsent is not None)
        if unsent:
            self.backed_up = True
            self._hooks.write_now(unsent)
        self.lent -= 1
        if not self.lent:
            self.holder = None
            self._hooks.loans_over()

    def lost(self) -> None:
        """The worker died while it wrote a lent answer."""
        self.lent -= 1
        if not self.lent:
            self.holder = None
        self._hooks.loan_lost(not self.lent)
