"""An HTTP/1.1 connection's side of the loans of its socket to model workers, for the answers
they write (the fast path: fastpath/connection_loans.py, docs/fast-path.md).

An HTTP/1.1 answer goes to the socket as it is, one at a time: while a worker may be writing
one, what the connection writes itself (and its close) waits, in order, in _HeldWrites, and
goes out when the last lent answer is back. LentSocket is a part of http1_connection.Connection
(it reads the connection's `transport`, `closing`, `server` and `loans`); without the fast
path the connection would simply not have it.
"""

# An HTTP/1.1 answer goes to the socket as it is: nothing before or after it.
_UNFRAMED = (b"", b"")


class _HeldWrites:
    """A connection's transport while a model's worker writes to its socket: what the
    connection writes (and a close) waits, in order, until the worker is done (`replay`)."""

    def __init__(self, transport):
        self.transport = transport
        self.ops: list = []
        self._closed = False

    def write(self, data) -> None:
        self.ops.append((self.transport.write, bytes(data)))

    def writelines(self, chunks) -> None:
        self.ops.append((self.transport.writelines, [bytes(c) for c in chunks]))

    def write_eof(self) -> None:
        self.ops.append((self.transport.write_eof,))

    def close(self) -> None:
        self._closed = True
        self.ops.append((self.transport.close,))

    def is_closing(self) -> bool:
        return self._closed or self.transport.is_closing()

    def __getattr__(self, name):  # reading, flow control, extra info: the transport's own
        return getattr(self.transport, name)

    def replay(self) -> None:
        for op, *args in self.ops:
            if self.transport.is_closing():
                return
            op(*args)


class LentSocket:
    """The connection's LoanHooks (fastpath/connection_loans.py)."""

    def lendable(self) -> bool:
        """Whether an answer on this connection may be written by a model's worker: not one
        that must say the connection closes (a head prepared earlier would not say it)."""
        return self.loans.lendable and not (self.closing or self.server.stopping
                                             or self.transport.is_closing())

    def lend_stream(self, stream, size: int, first: bool):
        """Not when the answer could come out of order: while this side has bytes of its own
        waiting to be written. A request served after the handler returned may be lent to
        the same worker again (its batches write in turn)."""
        if not self.lendable():
            return None
        transport = self.transport
        if not first:
            if transport.ops:
                return None  # what waits would come after the worker's next answer
        elif transport.get_write_buffer_size():
            return None
        else:
            self.transport = _HeldWrites(transport)
        return _UNFRAMED

    def stream_returned(self, stream, written: bool) -> None:
        pass  # the handler answers an answer the worker did not write, as usual

    def write_now(self, data: bytes) -> None:
        socket_transport = self.transport.transport
        if not socket_transport.is_closing():
            socket_transport.write(data)

    def loans_over(self) -> None:
        held = self.transport
        self.transport = held.transport
        held.replay()

    def loan_lost(self, last: bool) -> None:
        self.closing = True
        if last:
            self.transport = self.transport.transport
        self.transport.close()
