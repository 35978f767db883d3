"""gRPC over HTTP/2, driven straight from the event loop: http2.py speaks HTTP/2 (frames,
HPACK, flow control, stream states); the thin gRPC layer above it (length-prefixed messages,
status trailers, metadata, deadlines, compression, message size limits) is this module, the
server, and its connections (connection.py, with their calls: call.py, call_dispatch.py,
call_answers.py).

Why not grpcio's server: grpc.aio costs much more CPU per unary call before a handler does
anything (perf/transport_floor.py; perf/findings/2026-11-transports.md), much of it handing
each event from its completion-queue thread to the loop. HTTP/2 fed by the loop's own
protocol callbacks costs a fraction of that, and nothing crosses a thread. grpclib, the asyncio
gRPC library built on the h2 HTTP/2 library, measured no better than grpc.aio here, and h2
itself was most of the cost (see http2.py), so both layers are ours and kept small.
"""

import asyncio
from dataclasses import dataclass
from typing import Callable

from shmserve.grpc import http2
from shmserve.grpc.call_answers import COMPRESSION_LEVELS
# The call's way of saying the server stops, and the status codes, are this module's too: the
# servicer names them from here (`X as X`: the ones this module does not use itself are
# re-exported on purpose).
from shmserve.grpc.call_dispatch import SHUTTING_DOWN as SHUTTING_DOWN
from shmserve.grpc.connection import Connection
from shmserve.grpc.status import ALREADY_EXISTS as ALREADY_EXISTS
from shmserve.grpc.status import CANCELLED as CANCELLED
from shmserve.grpc.status import INTERNAL as INTERNAL
from shmserve.grpc.status import INVALID_ARGUMENT as INVALID_ARGUMENT
from shmserve.grpc.status import NOT_FOUND as NOT_FOUND
from shmserve.grpc.status import RESOURCE_EXHAUSTED as RESOURCE_EXHAUSTED
from shmserve.grpc.status import UNAVAILABLE as UNAVAILABLE
from shmserve.grpc.status import UNIMPLEMENTED as UNIMPLEMENTED
from shmserve.grpc.status import UNKNOWN as UNKNOWN
from shmserve.grpc.status import RpcError as RpcError

# A connection whose client has not sent its preface and SETTINGS by then is closed: sockets
# that never speak HTTP/2 would otherwise be held for ever.
HANDSHAKE_TIMEOUT_S = 10.0
# Connection limits' defaults (ConnectionLimits, the flags in host/cli.py).
MAX_CONNECTIONS = 10000
MAX_STREAMING_CALLS_PER_CONNECTION = 256
MAX_CONNECTION_IDLE_S = 300.0
MAX_DECOMPRESSED_SIZE = 64 * 1024 * 1024  # as tritonserver's --http-max-input-size
# Keepalive defaults: Triton's --grpc-keepalive-time (2 h) and --grpc-keepalive-timeout (20 s).
KEEPALIVE_TIME_S = 7200.0
KEEPALIVE_TIMEOUT_S = 20.0


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
        self._server = await loop.create_server(lambda: Connection(self), host, port,
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
