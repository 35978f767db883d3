"""A gRPC connection's side of the loans of its socket to model workers, for the answers they
write (the fast path: fastpath/connection_loans.py, docs/fast-path.md).

A unary call's answer is three HTTP/2 frames on a connection that many calls share: HEADERS,
one DATA frame with the length-prefixed message, and the trailers. While an answer is lent,
its stream is the worker's (http2.ServerConnection.lend_stream: its DATA already counts
against the windows) and the connection writes nothing (connection.Connection.flush waits
for the loans to end). LentStreams is a part of connection.Connection; without the fast path
the connection would simply not have it.
"""

from shmserve.grpc.call import Call
from shmserve.grpc.call_answers import _OK_TRAILERS, _RESPONSE_HEADERS


class LentStreams:
    """The connection's LoanHooks (fastpath/connection_loans.py), for unary calls."""

    def lend_stream(self, call: Call, size: int, first: bool):
        """The frames before `call`'s answer (its HEADERS, the head of one DATA frame, the
        message's prefix) and after it (the trailers), once the stream is the worker's. Only
        when nothing of ours waits to be written: a loan to a later batch would hold up our
        frames (a PING's ACK, a WINDOW_UPDATE, an error) for longer still."""
        if call.finished or call.headers_sent or call.response_encoding \
                or size > self.server.max_message_size or self.transport.is_closing() \
                or (self._paused is not None and not self._paused.done()):
            return None
        if first:
            self.flush()
            if self.transport.get_write_buffer_size():
                return None
        elif self.http2.has_output():
            return None  # this side has something to say: the loans end first
        data_size = size + 5
        frames = self.http2.lend_stream(call.stream_id, _RESPONSE_HEADERS, data_size,
                                        _OK_TRAILERS)
        if frames is None:
            return None
        before, after = frames
        call.lent = data_size
        return before + b"\0" + size.to_bytes(4, "big"), after

    def stream_returned(self, call: Call, written: bool) -> None:
        """A call whose answer the worker wrote is over; one it did not write is answered
        here as usual."""
        self.http2.return_stream(call.stream_id, call.lent, written, not call.finished)
        call.lent = 0
        if written:
            if not call.finished:
                call.finished = True
                self._forget(call)
        elif call.expired and not call.finished and call.task is not None:
            call.task.cancel()  # its deadline passed while the worker had it

    def write_now(self, data: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(data)

    def loans_over(self) -> None:
        self.flush()

    def loan_lost(self, last: bool) -> None:
        self.transport.close()
