"""One gRPC connection, driven by the event loop's protocol callbacks: it feeds what it reads
to its HTTP/2 side (http2.ServerConnection), paced so that no client holds the loop, writes
what that side has to send, and keeps the connection's life: its handshake, keepalive PINGs,
GOAWAY when it is too old or idle or the server stops.

The connection is one object whose parts are classes of their own modules, each for one
concern: its calls as the client's frames make them (call_dispatch.CallDispatch), answering
them (call_answers.CallAnswers), and the fast path's loans of its socket to model workers
(loans.LentStreams, docs/fast-path.md). They share the connection's state, set up here.
"""

import asyncio
import logging

from shmserve.fastpath.connection_loans import ConnectionLoans
from shmserve.grpc import http2
from shmserve.grpc.call_answers import CallAnswers
from shmserve.grpc.call_dispatch import CallDispatch
from shmserve.grpc.inbound import STREAM_WINDOW, Inbound
from shmserve.grpc.loans import LentStreams

log = logging.getLogger("shmserve.grpc")

# The connection's window, given back as data comes (http2.py): the streams' windows bound
# what a connection buffers (inbound.py).
CONNECTION_WINDOW = 64 * 1024 * 1024
# A frame's bytes wait until the whole frame has come, so this bounds what a client can hold
# unparsed (RFC 9113's default).
MAX_FRAME_SIZE = 16 * 1024
# HTTP/2 streams per connection (each is one call). The caps on work are the dataplane's
# (--max-inflight-per-connection, --max-open-streams); this one bounds per-connection state.
MAX_CONCURRENT_STREAMS = 1024
# gRPC's own hard limit on metadata (GRPC_ARG_ABSOLUTE_MAX_METADATA_SIZE); a longer header
# block is refused before it is decoded (http2.py).
MAX_HEADER_LIST_SIZE = 16 * 1024
_KEEPALIVE_PING = b"shmsrvka"

# Why reading a connection is paused (bits of Connection._reading_paused).
_WRITES_PAUSED = 1  # the client does not read what we write
_PARSING = 2  # what was read is still being parsed (http2.ServerConnection.receive)
_TURN = 4  # it had its share of this turn of the loop (READ_PER_TURN)
# A connection is read at most about this much in one turn of the loop: the loop's reader
# reads a socket again and again while it has data (up to 32 times, 8 MiB), so one client
# sending as fast as it can would hold every turn for tens of milliseconds.
READ_PER_TURN = 256 * 1024


class Connection(CallDispatch, CallAnswers, LentStreams, asyncio.Protocol):
    def __init__(self, server):
        """`server`: its transport.GrpcServer."""
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
        if self.loans.lent:  # the fast path: a model's worker may be writing; ours wait
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

    def goaway(self) -> None:
        self.http2.close_connection()
        self.flush()

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

    # The connection's end
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
        if self.calls or self.loans.lent:  # a lent answer is a call not yet over
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
