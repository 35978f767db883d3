"""gRPC over HTTP/2, driven straight from the event loop: http2.py speaks HTTP/2 (frames,
HPACK, flow control, stream states); this module is the thin gRPC layer above it (length-
prefixed messages, status trailers, metadata, deadlines, compression, message size limits).

Why not grpcio's server: on the 2-core reference machine grpc.aio costs about 190 µs of CPU per
unary call before a handler does anything (perf/transport_floor.py), much of it handing each
event from its completion-queue thread to the loop. HTTP/2 fed by the loop's own protocol
callbacks costs a fraction of that, and nothing crosses a thread. grpclib, the asyncio gRPC
library built on the h2 HTTP/2 library, measured no better than grpc.aio here, and h2 itself
was most of the cost (see http2.py), so both layers are ours and kept small.
"""

import asyncio
import logging
import zlib
from dataclasses import dataclass
from typing import Callable

from shmserve import eager
from shmserve.fastpath.connection_loans import ConnectionLoans
from shmserve.fastpath.prepared_answers import WRITTEN_BY_WORKER
from shmserve.grpc import http2
from shmserve.grpc.inbound import STREAM_WINDOW, WBITS, Compressed, Inbound
# The status codes are this module's too: the servicer names them from here (`X as X`: the
# ones this module does not use itself are re-exported on purpose).
from shmserve.grpc.status import ALREADY_EXISTS as ALREADY_EXISTS
from shmserve.grpc.status import INTERNAL as INTERNAL
from shmserve.grpc.status import NOT_FOUND as NOT_FOUND
from shmserve.grpc.status import (CANCELLED, DEADLINE_EXCEEDED, INVALID_ARGUMENT, OK,
                                  RESOURCE_EXHAUSTED, UNAVAILABLE, UNIMPLEMENTED, UNKNOWN,
                                  RpcError)

log = logging.getLogger("shmserve.grpc")

# The connection's window, given back as data comes (http2.py): the streams' windows bound
# what a connection buffers (inbound.py).
CONNECTION_WINDOW = 64 * 1024 * 1024
# A frame's bytes wait until the whole frame has come, so this bounds what a client can hold
# unparsed (RFC 9113's default).
MAX_FRAME_SIZE = 16 * 1024
# A connection whose client has not sent its preface and SETTINGS by then is closed: sockets
# that never speak HTTP/2 would otherwise be held for ever.
HANDSHAKE_TIMEOUT_S = 10.0
# HTTP/2 streams per connection (each is one call). The caps on work are the dataplane's
# (--max-inflight-per-connection, --max-open-streams); this one bounds per-connection state.
MAX_CONCURRENT_STREAMS = 1024
# gRPC's own hard limit on metadata (GRPC_ARG_ABSOLUTE_MAX_METADATA_SIZE); a longer header
# block is refused before it is decoded (http2.py).
MAX_HEADER_LIST_SIZE = 16 * 1024
# Connection limits' defaults (ConnectionLimits, the flags in host/cli.py).
MAX_CONNECTIONS = 10000
MAX_STREAMING_CALLS_PER_CONNECTION = 256
MAX_CONNECTION_IDLE_S = 300.0
MAX_DECOMPRESSED_SIZE = 64 * 1024 * 1024  # as tritonserver's --http-max-input-size
# grpc-message is cut to this many bytes (before percent-encoding): clients refuse long
# metadata, and encoding what a client sent (a model name of megabytes) would cost the loop.
MAX_STATUS_MESSAGE_BYTES = 1024
# Keepalive defaults: Triton's --grpc-keepalive-time (2 h) and --grpc-keepalive-timeout (20 s).
KEEPALIVE_TIME_S = 7200.0
KEEPALIVE_TIMEOUT_S = 20.0
_KEEPALIVE_PING = b"shmsrvka"

_RESPONSE_HEADERS = ((b":status", b"200"), (b"content-type", b"application/grpc"))
_OK_TRAILERS = ((b"grpc-status", b"0"),)
# Headers that are HTTP/2 or gRPC machinery, not the caller's metadata.
_RESERVED = frozenset((b"content-type", b"te", b"grpc-timeout", b"grpc-encoding",
                       b"grpc-accept-encoding", b"user-agent"))
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
# --grpc-infer-response-compression-level. As gRPC's servers (which Triton's is) choose: of
# the algorithms the client accepts, ranked gzip then deflate, low takes the first, medium
# the middle one and high the last.
COMPRESSION_LEVELS = ("none", "low", "medium", "high")
_RANKED = (b"gzip", b"deflate")
_ENCODED_HEADERS = {name: _RESPONSE_HEADERS + ((b"grpc-encoding", name),) for name in _RANKED}
# Triton's answer to a call, or a request on an open stream, once the server is stopping.
SHUTTING_DOWN = "GRPC server is shutting down and has stopped accepting new requests."


@dataclass(frozen=True)
class Method:
    """A handler: unary ones are `async fn(request, call) -> response`; streaming ones (both
    sides streaming) are async generators `fn(requests, call)`. `deserialize` turns a message
    (bytes-like) into the request, or is None for a handler that takes the message as it is;
    `serialize` turns a response into bytes. `check_partial(head, length)`: what is wrong
    with a message of `length` bytes whose first bytes are `head` (None: nothing yet), asked
    once of a message still arriving past inbound.CHECK_PARTIAL_FROM bytes."""

    handler: Callable
    deserialize: Callable | None
    serialize: Callable
    streaming: bool
    check_partial: Callable | None = None


@dataclass(frozen=True)
class ConnectionLimits:
    """What one client may hold of the server, with tritonserver's flags where it has them
    (host/cli.py): connections at once (0: no limit), streaming calls per connection, how long a
    connection may stay without calls before GOAWAY (0: for ever), the size a compressed
    message may inflate to, and gRPC's ping policy (see http2.py)."""

    max_connections: int = MAX_CONNECTIONS
    max_streaming_calls: int = MAX_STREAMING_CALLS_PER_CONNECTION
    max_connection_idle: float = MAX_CONNECTION_IDLE_S
    max_decompressed_size: int = MAX_DECOMPRESSED_SIZE
    ping_interval: float = http2.PING_INTERVAL_WITHOUT_DATA_S
    max_ping_strikes: int = http2.MAX_PING_STRIKES


class _Call:
    """One RPC: what its handler sees as `context`, and as the request iterator of a
    streaming method."""

    __slots__ = ("conn", "stream_id", "method", "headers", "encoding", "response_encoding",
                 "buffer", "messages", "remote_ended", "waiter", "task", "deadline",
                 "expired", "headers_sent", "finished", "lent", "reserved", "queued",
                 "checked", "incoming")

    def __init__(self, conn: "_Connection", stream_id: int, method: Method, headers: list,
                 encoding: bytes | None, response_encoding: bytes | None = None):
        self.conn = conn
        self.stream_id = stream_id
        self.method = method
        self.headers = headers
        self.encoding = encoding  # of the client's messages
        self.response_encoding = response_encoding  # of ours, None: not compressed
        # Its messages coming in (inbound.Inbound's): bytes of the next one, whole ones not
        # taken yet, and how the connection's flow control stands with them.
        self.buffer = bytearray()
        self.messages: list = []
        self.remote_ended = False
        self.waiter: asyncio.Future | None = None
        self.task: asyncio.Task | None = None
        self.deadline: asyncio.TimerHandle | None = None
        self.expired = False
        self.headers_sent = False
        self.finished = False
        self.lent = 0  # the DATA size of its answer while another writer has it, else 0
        self.reserved = 0  # the size of the unfinished message admitted
        self.queued = False  # its unfinished message waits for room
        self.checked = False  # its unfinished message's start was looked at
        self.incoming = None  # a large message being received

    # The handler's context.
    def invocation_metadata(self) -> tuple:
        return tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in self.headers
                     if k[:1] != b":" and k not in _RESERVED)

    # The request iterator of a streaming method.
    def __aiter__(self):
        return self

    async def __anext__(self):
        while not self.messages:
            if self.remote_ended or self.finished:
                raise StopAsyncIteration
            self.waiter = self.conn.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        if type(self.messages[0]) is Compressed:
            try:
                await self.conn.inbound.inflate_first(self)
            except RpcError as exc:  # the call ends with it, not only the iteration
                self.conn._fail(self, exc.code, exc.message)
                raise StopAsyncIteration from None
        return self.conn.take(self)

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    # The handler's way past its own iteration (a streaming handler only).
    def send_now(self, data: bytes) -> bool:
        """Writes message `data` at once, when nothing makes it wait (the socket keeps up,
        it fits the flow-control window and one frame, no compression); False when it must
        be yielded like the others. The handler says when: nothing it yielded may still be
        on its way out."""
        return self.conn.send_now(self, data)


# Why reading a connection is paused (bits of _Connection._reading_paused).
_WRITES_PAUSED = 1  # the client does not read what we write
_PARSING = 2  # what was read is still being parsed (http2.ServerConnection.receive)
_TURN = 4  # it had its share of this turn of the loop (READ_PER_TURN)
# A connection is read at most about this much in one turn of the loop: the loop's reader
# reads a socket again and again while it has data (up to 32 times, 8 MiB), so one client
# sending as fast as it can would hold every turn for tens of milliseconds.
READ_PER_TURN = 256 * 1024


class _Connection(asyncio.Protocol):
    def __init__(self, server: "GrpcServer"):
        self.server = server
        self.calls: dict = {}
        self.transport = None
        self.loop = None
        self.http2: http2.ServerConnection | None = None
        self._paused: asyncio.Future | None = None
        self._flush_scheduled = False
        self._silent: asyncio.TimerHandle | None = None
        self._leaving = False  # GOAWAY sent or received: close once the calls end
        self._aging: asyncio.TimerHandle | None = None  # --grpc-max-connection-age
        self._window_waiters: list = []  # futures of calls waiting for a send window
        self._keepalive: asyncio.TimerHandle | None = None  # next PING, or its deadline
        # Its socket as lent to models' workers, for the answers they write (the fast path):
        # while an answer is lent, this side writes nothing.
        self.loans = ConnectionLoans(self)
        self._reading_paused = 0  # why reading is paused: _WRITES_PAUSED, _PARSING, _TURN
        self._turn_bytes = 0  # read since reading was last paused for a turn
        self.inbound: Inbound | None = None  # the messages its clients send
        self.streaming_calls = 0
        self._idle: asyncio.TimerHandle | None = None  # --grpc-max-connection-idle
        self._idle_since = 0.0  # when the last call ended

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.loop = loop = asyncio.get_running_loop()
        server = self.server
        limits = server.limits
        sock = transport.get_extra_info("socket")
        if sock is not None and transport.get_extra_info("sslcontext") is None:
            self.loans.fd = sock.fileno()
        self.http2 = http2.ServerConnection(
            self, max_concurrent_streams=MAX_CONCURRENT_STREAMS, stream_window=STREAM_WINDOW,
            connection_window=CONNECTION_WINDOW, max_frame_size=MAX_FRAME_SIZE,
            max_header_list_size=MAX_HEADER_LIST_SIZE, ping_interval=limits.ping_interval,
            max_ping_strikes=limits.max_ping_strikes,
            pings_without_calls=server.keepalive_without_calls, clock=loop.time)
        self.inbound = Inbound(self.http2, server.max_message_size, limits.max_decompressed_size,
                               self._fail, self.flush_soon)
        if limits.max_connections and len(server.connections) >= limits.max_connections:
            self.http2.close_connection(http2.NO_ERROR, (
                f"the server has {len(server.connections)} gRPC connections, the most it "
                f"allows (--grpc-max-connections)"))
            self.flush()
            transport.close()
            return
        server.connections.add(self)
        self.flush()
        self._silent = loop.call_later(server.handshake_timeout, self._handshake_timed_out)
        self._arm_keepalive()
        if server.max_connection_age:
            self._aging = loop.call_later(server.max_connection_age, self._age_out)
        self._idle_since = loop.time()
        if limits.max_connection_idle:
            self._idle = loop.call_later(limits.max_connection_idle, self._check_idle)

    def data_received(self, data: bytes) -> None:
        self._turn_bytes += len(data)
        if self._turn_bytes > READ_PER_TURN:
            self._turn_bytes = 0
            self._pause_reading(_TURN)
            self.loop.call_soon(self._resume_reading, _TURN)
        try:
            done = self.http2.receive(data)
        except http2.Http2Error as exc:
            self._protocol_error(exc)
            return
        if self._silent is not None and self.http2.established:
            self._silent.cancel()
            self._silent = None
        if not done:
            self._pause_reading(_PARSING)
            self.loop.call_soon(self._parse_rest)
        self.flush()

    def _parse_rest(self) -> None:
        """The rest of what was read, once the loop has served the others (see
        http2.ServerConnection.receive); reading resumes when it is all parsed."""
        if self.transport.is_closing():
            return
        try:
            done = self.http2.receive(b"")
        except http2.Http2Error as exc:
            self._protocol_error(exc)
            return
        if done:
            self._resume_reading(_PARSING)
        else:
            self.loop.call_soon(self._parse_rest)
        self.flush()

    def _protocol_error(self, exc: http2.Http2Error) -> None:
        log.debug("gRPC connection closed: HTTP/2 protocol error: %s", exc)
        self.flush()
        self.transport.close()

    def _handshake_timed_out(self) -> None:
        log.debug("gRPC connection closed: no HTTP/2 preface and SETTINGS within %g s",
                  self.server.handshake_timeout)
        self._silent = None
        self.transport.close()

    def _pause_reading(self, why: int) -> None:
        if not self._reading_paused:
            self.transport.pause_reading()
        self._reading_paused |= why

    def _resume_reading(self, why: int) -> None:
        if self._reading_paused & why:
            self._reading_paused &= ~why
            if not self._reading_paused and not self.transport.is_closing():
                self.transport.resume_reading()

    def connection_lost(self, exc) -> None:
        self.server.connections.discard(self)
        for timer in (self._silent, self._keepalive, self._aging, self._idle):
            if timer is not None:
                timer.cancel()
        for call in list(self.calls.values()):
            self._drop(call)
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)

    def pause_writing(self) -> None:
        # A client that does not read is not read from either: what it sends would queue
        # answers (ACKs, errors) without end. Its HTTP/2 stack reads while it writes, so a
        # client that does read is not held up.
        if self._paused is None or self._paused.done():
            self._paused = self.loop.create_future()
        self._pause_reading(_WRITES_PAUSED)

    def resume_writing(self) -> None:
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)
        self._resume_reading(_WRITES_PAUSED)

    # Writing
    def flush(self) -> None:
        if self.loans.lent:  # a model's worker may be writing: ours wait (loans_over)
            return
        chunks = self.http2.data_to_send()
        if chunks and not self.transport.is_closing():
            self.transport.writelines(chunks)

    def flush_soon(self) -> None:
        """Responses that leave in the same loop iteration share one write."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self._flush_scheduled = False
        self.flush()

    # Its socket lent to a model's worker (fastpath/connection_loans.py's LoanHooks): a
    # unary call's answer, framed for its stream; this side writes nothing meanwhile.
    def lend_stream(self, call: _Call, size: int, first: bool):
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

    def stream_returned(self, call: _Call, written: bool) -> None:
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

    def goaway(self) -> None:
        self.http2.close_connection()
        self.flush()

    # What the client did (http2.ServerConnection's listener)
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
        call = _Call(self, sid, method, headers, encoding,
                     response_encoding(level, accepted) if level else None)
        self.calls[sid] = call
        if timeout is not None:
            seconds = _timeout_seconds(timeout)
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

    def take(self, call: _Call):
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

    def _drop(self, call: _Call) -> None:
        call.finished = True
        self._forget(call)
        if call.task is not None:
            call.task.cancel()
        call.wake()

    def _expire(self, call: _Call) -> None:
        call.deadline = None
        if call.finished:
            return
        if call.lent:  # its answer may be on the wire already: stream_returned decides
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

    # Keepalive: a PING every `keepalive_time` while calls are open (or always, if
    # permitted), and the connection closes when one goes unanswered for `keepalive_timeout`:
    # a peer that vanished without closing (a dead host, a dropped NAT entry) frees its calls.
    def _arm_keepalive(self) -> None:
        server = self.server
        if server.keepalive_time:
            self._keepalive = asyncio.get_running_loop().call_later(server.keepalive_time,
                                                                    self._ping)

    def _ping(self) -> None:
        if self.transport.is_closing():
            return
        if not (self.calls or self.server.keepalive_without_calls):
            self._arm_keepalive()
            return
        self.http2.send_ping(_KEEPALIVE_PING)
        self.flush()
        self._keepalive = asyncio.get_running_loop().call_later(
            self.server.keepalive_timeout, self._ping_unanswered)

    def _ping_unanswered(self) -> None:
        log.debug("gRPC connection closed: keepalive PING unanswered for %g s",
                  self.server.keepalive_timeout)
        self._keepalive = None
        self.transport.close()

    def on_ping_ack(self, payload: bytes) -> None:
        if payload == _KEEPALIVE_PING and self._keepalive is not None:
            self._keepalive.cancel()
            self._arm_keepalive()

    def _age_out(self) -> None:
        """The connection is old enough: GOAWAY, so that the client opens a new one (and a
        load balancer sees it); calls in flight finish, for at most the grace."""
        self._aging = None
        self.goaway()
        self._leaving = True
        if not self.calls:
            self.transport.close()
        elif self.server.max_connection_age_grace:
            self._aging = asyncio.get_running_loop().call_later(
                self.server.max_connection_age_grace, self.transport.close)

    def _check_idle(self) -> None:
        """--grpc-max-connection-idle: GOAWAY once no call has been open that long."""
        idle = self.server.limits.max_connection_idle
        now = self.loop.time()
        if self.calls or self.loans.lent:
            self._idle = self.loop.call_later(idle, self._check_idle)
        elif now - self._idle_since < idle:
            self._idle = self.loop.call_later(self._idle_since + idle - now, self._check_idle)
        else:
            self._idle = None
            log.debug("gRPC connection closed: no call for %g s", idle)
            self.http2.close_connection(http2.NO_ERROR, "max_idle")
            self.flush()
            self.transport.close()

    def leave(self) -> None:
        """The server stops taking calls: GOAWAY; calls in flight finish, then it closes."""
        self.goaway()
        self._leaving = True
        if not self.calls and not self.loans.lent:
            self.transport.close()

    def on_goaway(self) -> None:
        """The client opens no more calls; those in flight still get their answers."""
        self._leaving = True
        if not self.calls:
            self.transport.close()

    # Serving
    async def _serve(self, call: _Call, body) -> None:
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

    async def _unary(self, call: _Call) -> None:
        if type(call.messages[0]) is Compressed:
            await self.inbound.inflate_first(call)
        response = await call.method.handler(self.take(call), call)
        if response is not WRITTEN_BY_WORKER:
            await self._send_message(call, call.method.serialize(response))

    async def _stream(self, call: _Call) -> None:
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

    def _cancelled(self, call: _Call) -> None:
        if call.expired:
            self._fail(call, DEADLINE_EXCEEDED, "Deadline Exceeded")
        elif not call.finished:
            self._fail(call, CANCELLED, "the server stopped the call")

    def send_now(self, call: _Call, data: bytes) -> bool:
        if (call.finished or not call.headers_sent or call.response_encoding
                or (self._paused is not None and not self._paused.done())
                or len(data) > self.server.max_message_size):
            return False
        return self._send_in_one_frame(call, b"\0", data)

    async def _send_message(self, call: _Call, data: bytes) -> None:
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

    def _send_in_one_frame(self, call: _Call, flag: bytes, data: bytes) -> bool:
        """Message `data` as one DATA frame: the common case, no waiting. False when the
        window or the frame size is too small.

        A unary call's answer is written by the flush_soon it asks for, with the others of
        the same turn of the loop. A stream's message is written at once: streamed responses
        are wanted as they come, and in alternating runs (repeat, 100 responses, c1) the
        time to first response fell from 734-812 to 686-689 µs (medians of 6-7 rounds),
        for about 2 % fewer responses/s at c8."""
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

    async def _send_large(self, call: _Call, prefix: bytes, view: memoryview) -> None:
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

    def _finish(self, call: _Call, code: int, message: str) -> None:
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

    def _fail(self, call: _Call, code: int, message: str) -> None:
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

    def _forget(self, call: _Call) -> None:
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


class GrpcServer:
    """Serves `methods` ({"/package.Service/Method": Method}) on one TCP address."""

    def __init__(self, methods: dict, max_message_size: int,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT_S,
                 keepalive_time: float = KEEPALIVE_TIME_S,
                 keepalive_timeout: float = KEEPALIVE_TIMEOUT_S,
                 keepalive_without_calls: bool = False, max_connection_age: float = 0.0,
                 max_connection_age_grace: float = 0.0, response_compression: str = "none",
                 limits: ConnectionLimits = ConnectionLimits()):
        """Keepalive (seconds; a time of 0 sends no PINGs): gRPC's server settings, with
        Triton's defaults. A connection older than `max_connection_age` seconds (0: no
        limit) is sent GOAWAY, and closed `max_connection_age_grace` seconds later if calls
        are still open (0: once they end). `response_compression`: one of
        COMPRESSION_LEVELS, for the messages the server sends. `limits`: what one client
        may hold."""
        self.methods = {path.encode(): method for path, method in methods.items()}
        self.limits = limits
        # 0 for none, else the level's index.
        self.response_compression = COMPRESSION_LEVELS.index(response_compression)
        self.max_message_size = max_message_size
        self.handshake_timeout = handshake_timeout
        self.keepalive_time = keepalive_time
        self.keepalive_timeout = keepalive_timeout
        self.keepalive_without_calls = keepalive_without_calls
        self.max_connection_age = max_connection_age
        self.max_connection_age_grace = max_connection_age_grace
        self.connections: set = set()
        self.stopping = False
        self._server: asyncio.AbstractServer | None = None
        self._idle: asyncio.Event | None = None

    async def start(self, host: str, port: int, ssl_context=None) -> None:
        """`ssl_context`: serve TLS (see tls.py); the handshake counts against the same
        timeout as HTTP/2's."""
        loop = asyncio.get_running_loop()
        tls = {} if ssl_context is None else {"ssl": ssl_context,
                                              "ssl_handshake_timeout": self.handshake_timeout}
        self._server = await loop.create_server(lambda: _Connection(self), host, port,
                                                reuse_address=True, **tls)

    def idle_check(self) -> None:
        if self._idle is not None and not any(c.calls for c in self.connections):
            self._idle.set()

    def stop_accepting(self) -> None:
        """Triton's graceful stop: no new connections (the port closes) and no new calls
        (GOAWAY; a call begun anyway is refused UNAVAILABLE); calls in flight go on, and
        each connection closes once its calls end."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.leave()

    async def stop(self, grace: float) -> None:
        """No new connections or calls; calls in flight get `grace` seconds to finish, then
        they are cancelled and every connection is closed."""
        self.stop_accepting()
        self._idle = asyncio.Event()
        self.idle_check()
        try:
            await asyncio.wait_for(self._idle.wait(), grace)
        except asyncio.TimeoutError:
            pass
        for conn in list(self.connections):
            for call in list(conn.calls.values()):
                conn._fail(call, UNAVAILABLE, "the server is shutting down")
            conn.flush()
            conn.transport.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None


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


def _timeout_seconds(value: bytes) -> float | None:
    """grpc-timeout: up to 8 digits and a unit (H, M, S, m, u, n)."""
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in _TIMEOUT_UNITS:
        return None
    return int(digits) * _TIMEOUT_UNITS[unit]


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
