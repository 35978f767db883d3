"""gRPC calls as the client's frames make them: a new stream becomes a call of a method (or
is refused: no such method, not gRPC, a compression it cannot read, a server stopping, too many
streaming calls), its messages come in, its end starts a unary call's handler (a streaming
call's handler starts with the call), and a reset or a deadline ends it.

CallDispatch is the part of connection.Connection that the HTTP/2 layer calls
(http2.ServerConnection's listener) for calls; call_answers.py runs what it starts.
"""

import asyncio

from shmserve import eager
from shmserve.grpc.call import Call, timeout_seconds
from shmserve.grpc.call_answers import response_encoding
from shmserve.grpc.inbound import WBITS
from shmserve.grpc.status import (DEADLINE_EXCEEDED, INVALID_ARGUMENT, UNAVAILABLE,
                                  UNIMPLEMENTED, UNKNOWN, RpcError)

# Triton's answer to a call, or a request on an open stream, once the server is stopping.
SHUTTING_DOWN = "GRPC server is shutting down and has stopped accepting new requests."


class CallDispatch:
    """What the client did to its calls (http2.ServerConnection's listener, with the
    connection's own callbacks in connection.py)."""

    def on_request(self, sid: int, headers: list) -> None:
        path = encoding = timeout = None
        content_type = accepted = b""
        for key, value in headers:
            if key == b":path":
                path = value
            elif key == b"content-type":
                content_type = value
            elif key == b"grpc-encoding":
                encoding = value
            elif key == b"grpc-timeout":
                timeout = value
            elif key == b"grpc-accept-encoding":
                accepted = value
        method = self.server.methods.get(path)
        if not content_type.startswith(b"application/grpc"):
            self._refuse(sid, UNKNOWN, "content-type must be application/grpc", b"415")
            return
        if method is None:
            self._refuse(sid, UNIMPLEMENTED, f"Method not found: {path.decode('latin-1')}"
                         if path else "no :path")
            return
        if encoding == b"identity":
            encoding = None
        if encoding is not None and encoding not in WBITS:
            self._refuse(sid, UNIMPLEMENTED, "Compression algorithm "
                                             f"'{encoding.decode('latin-1')}' not supported")
            return
        if self.server.stopping:
            self._refuse(sid, UNAVAILABLE, SHUTTING_DOWN)
            return
        if method.streaming:
            limit = self.server.limits.max_streaming_calls
            if self.streaming_calls >= limit:
                self._refuse(sid, UNAVAILABLE, f"the connection has {limit} streaming calls "
                                               f"open, the most it allows "
                                               f"(--max-open-streams-per-connection): retry "
                                               f"later")
                return
            self.streaming_calls += 1
        level = self.server.response_compression
        call = Call(self, sid, method, headers, encoding,
                     response_encoding(level, accepted) if level else None)
        self.calls[sid] = call
        if timeout is not None:
            seconds = timeout_seconds(timeout)
            if seconds is None:
                self._fail(call, INVALID_ARGUMENT,
                           f"invalid grpc-timeout: {timeout[:64].decode('latin-1')}")
                return
            call.deadline = asyncio.get_running_loop().call_later(seconds, self._expire, call)
        if method.streaming:
            call.task = asyncio.ensure_future(self._serve(call, self._stream))

    def on_data(self, sid: int, data, size: int) -> None:
        call = self.calls.get(sid)
        if call is not None and not call.finished:
            self.inbound.data(call, data)

    def take(self, call: Call):
        """The next message of `call` (inflated already), deserialized; its stream's window
        grows again once no message waits (Inbound.refill)."""
        message = call.messages.pop(0)
        if not call.messages and not call.remote_ended:
            self.inbound.refill(call)
            if self.http2.has_output():
                self.flush_soon()
        deserialize = call.method.deserialize
        if deserialize is None:
            return message
        try:
            return deserialize(message)
        except Exception as exc:
            raise RpcError(INVALID_ARGUMENT,
                           f"cannot parse the request message: {exc}") from None

    def on_end(self, sid: int) -> None:
        call = self.calls.get(sid)
        if call is None or call.finished:
            return
        call.remote_ended = True
        if call.buffer:
            self._fail(call, INVALID_ARGUMENT, "the stream ended inside a message")
        elif call.method.streaming:
            call.wake()
        elif len(call.messages) != 1:
            self._fail(call, UNIMPLEMENTED if call.messages else INVALID_ARGUMENT,
                       "a unary call takes exactly one request message")
        else:
            # Started now, so the request reaches its scheduler in this turn of the loop.
            call.task = eager.start(self._serve(call, self._unary), self.loop)

    def on_reset(self, sid: int) -> None:
        """The client cancelled the call: its handler is cancelled, nothing more is sent."""
        call = self.calls.get(sid)
        if call is not None:
            self._drop(call)

    def _drop(self, call: Call) -> None:
        call.finished = True
        self._forget(call)
        if call.task is not None:
            call.task.cancel()
        call.wake()

    def _expire(self, call: Call) -> None:
        call.deadline = None
        if call.finished:
            return
        if call.lent:  # the fast path: its answer may be on the wire; stream_returned decides
            call.expired = True
            return
        if call.task is not None and not call.task.done():
            call.expired = True
            call.task.cancel()
        else:
            self._fail(call, DEADLINE_EXCEEDED, "Deadline Exceeded")
            self.flush()

    def on_window(self) -> None:
        # Clients send WINDOW_UPDATEs all the time (gRPC's: two per call), and few calls
        # wait for one: only those are woken.
        if self._window_waiters:
            waiters, self._window_waiters = self._window_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
