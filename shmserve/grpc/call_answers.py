"""Answering gRPC calls: running a call's handler, sending its messages (one DATA frame when
they fit, else as the flow-control windows allow; compressed when the call asked), and ending
the call with its status in the trailers.

CallAnswers is a part of connection.Connection (it reads the connection's `http2`, `server`,
`calls`, `inbound` and its flushing); call_dispatch.py starts the handlers.
"""

import asyncio
import logging
import zlib

from shmserve.fastpath.prepared_answers import WRITTEN_BY_WORKER
from shmserve.grpc.call import Call
from shmserve.grpc.inbound import WBITS, Compressed
from shmserve.grpc.status import (CANCELLED, DEADLINE_EXCEEDED, OK, RESOURCE_EXHAUSTED,
                                  UNKNOWN, RpcError)

log = logging.getLogger("shmserve.grpc")

# grpc-message is cut to this many bytes (before percent-encoding): clients refuse long
# metadata, and encoding what a client sent (a model name of megabytes) would cost the loop.
MAX_STATUS_MESSAGE_BYTES = 1024

_RESPONSE_HEADERS = ((b":status", b"200"), (b"content-type", b"application/grpc"))
_OK_TRAILERS = ((b"grpc-status", b"0"),)
# --grpc-infer-response-compression-level. As gRPC's servers (which Triton's is) choose: of
# the algorithms the client accepts, ranked gzip then deflate, low takes the first, medium
# the middle one and high the last.
COMPRESSION_LEVELS = ("none", "low", "medium", "high")
_RANKED = (b"gzip", b"deflate")
_ENCODED_HEADERS = {name: _RESPONSE_HEADERS + ((b"grpc-encoding", name),) for name in _RANKED}


class CallAnswers:
    """The connection's side of each call once it started: its handler, its messages out, and
    its end."""

    async def _serve(self, call: Call, body) -> None:
        """Runs `body(call)`, then ends the call with its status."""
        try:
            await body(call)
            self._finish(call, OK, "")
        except asyncio.CancelledError:
            self._cancelled(call)
        except RpcError as exc:
            self._fail(call, exc.code, exc.message)
        except Exception:
            log.exception("gRPC handler for stream %d failed", call.stream_id)
            self._fail(call, UNKNOWN, "Unexpected error in the RPC handler")

    async def _unary(self, call: Call) -> None:
        if type(call.messages[0]) is Compressed:
            await self.inbound.inflate_first(call)
        response = await call.method.handler(self.take(call), call)
        if response is not WRITTEN_BY_WORKER:  # the fast path: the worker wrote it
            await self._send_message(call, call.method.serialize(response))

    async def _stream(self, call: Call) -> None:
        serialize = call.method.serialize
        responses = call.method.handler(call, call)
        try:
            async for response in responses:
                # A burst of responses (a decoupled model answering many at once) is taken
                # without a pause: its first one goes out now, not after the whole burst was
                # encoded; the rest share the write at the end of the loop iteration.
                first_of_burst = not self._flush_scheduled
                await self._send_message(call, serialize(response))
                if first_of_burst:
                    self.flush()
        finally:
            await responses.aclose()

    def _cancelled(self, call: Call) -> None:
        if call.expired:
            self._fail(call, DEADLINE_EXCEEDED, "Deadline Exceeded")
        elif not call.finished:
            self._fail(call, CANCELLED, "the server stopped the call")

    def send_now(self, call: Call, data: bytes) -> bool:
        if (call.finished or not call.headers_sent or call.response_encoding
                or (self._paused is not None and not self._paused.done())
                or len(data) > self.server.max_message_size):
            return False
        return self._send_in_one_frame(call, b"\0", data)

    async def _send_message(self, call: Call, data: bytes) -> None:
        if call.finished:
            raise asyncio.CancelledError
        limit = self.server.max_message_size
        if len(data) > limit:
            raise RpcError(RESOURCE_EXHAUSTED,
                           f"Sent message larger than max ({len(data)} vs. {limit})")
        conn = self.http2
        sid = call.stream_id
        if not call.headers_sent:
            conn.send_headers(sid, _ENCODED_HEADERS[call.response_encoding]
                              if call.response_encoding else _RESPONSE_HEADERS)
            call.headers_sent = True
        if self._paused is not None and not self._paused.done():
            await self._paused  # the socket is not keeping up: the handler waits
            if call.finished:  # the client went away meanwhile
                raise asyncio.CancelledError
        flag = b"\0"
        if call.response_encoding:
            packed = _compress(data, call.response_encoding)
            if len(packed) < len(data):  # else it goes as it is, as gRPC's do
                data, flag = packed, b"\1"
        if not self._send_in_one_frame(call, flag, data):
            await self._send_large(call, flag + len(data).to_bytes(4, "big"), memoryview(data))

    def _send_in_one_frame(self, call: Call, flag: bytes, data: bytes) -> bool:
        """Message `data` as one DATA frame: the common case, no waiting. False when the
        window or the frame size is too small.

        A unary call's answer is written by the flush_soon it asks for, with the others of
        the same turn of the loop. A stream's message is written at once: streamed responses
        are wanted as they come, and the first one comes sooner for a little fewer
        responses/s under load (perf/findings/2026-11-streaming.md)."""
        conn = self.http2
        sid = call.stream_id
        if len(data) + 5 > min(conn.send_window(sid), conn.max_outbound_frame_size):
            return False
        conn.send_data(sid, flag + len(data).to_bytes(4, "big") + data)
        if call.method.streaming:
            self.flush()
        else:
            self.flush_soon()
        return True

    async def _send_large(self, call: Call, prefix: bytes, view: memoryview) -> None:
        conn = self.http2
        sid = call.stream_id
        pending = [memoryview(prefix), view]
        loop = asyncio.get_running_loop()
        for chunk in pending:
            while chunk:
                if call.finished:
                    raise asyncio.CancelledError
                size = min(conn.send_window(sid), conn.max_outbound_frame_size,
                           len(chunk))
                if size <= 0:
                    self.flush()
                    waiter = loop.create_future()
                    self._window_waiters.append(waiter)
                    await waiter  # cancelled with the call's task if the call ends first
                    continue
                conn.send_data(sid, chunk[:size])
                chunk = chunk[size:]
                self.flush()
                if self._paused is not None and not self._paused.done():
                    await self._paused

    def _finish(self, call: Call, code: int, message: str) -> None:
        """Ends the call with its status in the trailers (alone when nothing was sent)."""
        if call.finished:
            return
        call.finished = True
        self._forget(call)
        trailers = _OK_TRAILERS if code == OK else (
            (b"grpc-status", str(code).encode()),
            (b"grpc-message", _percent_encode(message)))
        if not call.headers_sent:
            trailers = _RESPONSE_HEADERS + trailers
        self.http2.send_headers(call.stream_id, trailers, end_stream=True)
        if not call.remote_ended:
            # The answer is complete: whatever the client still sends is not wanted.
            self.http2.reset_stream(call.stream_id)
        self.flush_soon()

    def _fail(self, call: Call, code: int, message: str) -> None:
        task = call.task
        self._finish(call, code, message)
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        call.wake()

    def _refuse(self, sid: int, code: int, message: str, status: bytes = b"200") -> None:
        self.http2.send_headers(sid, ((b":status", status),
                                      (b"content-type", b"application/grpc"),
                                      (b"grpc-status", str(code).encode()),
                                      (b"grpc-message", _percent_encode(message))),
                                end_stream=True)
        self.http2.reset_stream(sid)

    def _forget(self, call: Call) -> None:
        if self.calls.pop(call.stream_id, None) is not None and call.method.streaming:
            self.streaming_calls -= 1
        self.inbound.forget(call)
        if call.deadline is not None:
            call.deadline.cancel()
            call.deadline = None
        if not self.calls:
            self._idle_since = self.loop.time()
            if self._leaving:
                self.flush_soon()  # the last answer goes out before the socket closes
                asyncio.get_running_loop().call_soon(self.transport.close)
            if self.server.stopping:
                self.server.idle_check()


def response_encoding(level: int, accepted: bytes) -> bytes | None:
    """The algorithm for the messages of a call whose client accepts `accepted` (its
    grpc-accept-encoding), at a COMPRESSION_LEVELS index; None: none."""
    names = {name.strip() for name in accepted.split(b",")}
    ranked = [name for name in _RANKED if name in names]
    if not level or not ranked:
        return None
    return ranked[(0, 0, len(ranked) // 2, -1)[level]]


def _compress(data, encoding: bytes) -> bytes:
    packer = zlib.compressobj(wbits=WBITS[encoding])
    return packer.compress(data) + packer.flush()


def _percent_encode(message: str) -> bytes:
    """grpc-message: UTF-8, with bytes outside printable ASCII and '%' as %XX, cut to
    MAX_STATUS_MESSAGE_BYTES."""
    limit = MAX_STATUS_MESSAGE_BYTES
    raw = message[:limit].encode("utf-8", "replace")
    if len(raw) > limit or len(message) > limit:
        raw = raw[:limit].decode("utf-8", "ignore").encode() + b"..."
    if all(0x20 <= b <= 0x7E and b != 0x25 for b in raw):
        return raw
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b
                    for b in raw)
