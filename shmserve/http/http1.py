"""HTTP/1.1 server side for the REST and metrics endpoints: httptools (Node's llhttp parser)
reads requests, and the event loop's own protocol callbacks drive everything else
(keep-alive, pipelining in order, Expect: 100-continue, size limits, timeouts, chunked
responses for event streams).

Why not aiohttp: it costs much more CPU per request than the same echo on httptools before a
handler runs (perf/transport_floor.py; perf/findings/2026-11-transports.md), most of it
building request objects, header multidicts and a task chain this server never uses. The
front is one CPU-bound thread, so that difference is HTTP throughput. Parsing HTTP is the part
to leave to a library; the rest is small.

Here the server: its connections are http1_connection.py (reading requests:
http1_reader.py), and what handlers see of a request and answer with is http1_messages.py.
"""

import asyncio

from shmserve.http.http1_connection import Connection
from shmserve.http.http1_reader import triton_too_large

_SWEEP_INTERVAL_S = 1.0


class HttpServer:
    """Serves `handle` (async: Request -> Response, or None after `request.stream()`) on
    one TCP address. Once more than `max_inflight` requests of one connection wait behind
    the one being served, the connection is not read until they are down to half."""

    def __init__(self, handle, max_input_size: int, max_inflight: int = 64, on_stop=None,
                 too_large=None):
        """`too_large(url, size, limit)`: the answer to a body over `max_input_size` (by
        default Triton's 400)."""
        self.handle = handle
        self.on_stop = on_stop
        self.max_input_size = max_input_size
        self.too_large = too_large or triton_too_large
        self.max_inflight = max(1, max_inflight)
        self.connections: set = set()
        self.stopping = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._idle: asyncio.Event | None = None

    async def start(self, host: str, port: int) -> None:
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(lambda: Connection(self), host, port,
                                                     reuse_address=True, backlog=1024)
        self._sweeper = self.loop.call_later(_SWEEP_INTERVAL_S, self._sweep)

    @property
    def port(self) -> int:
        """The port listened on (useful after starting on port 0)."""
        return self._server.sockets[0].getsockname()[1]

    def _sweep(self) -> None:
        now = self.loop.time()
        for conn in list(self.connections):
            conn.check_timeouts(now)
        self._sweeper = self.loop.call_later(_SWEEP_INTERVAL_S, self._sweep)

    def check_idle(self) -> None:
        if self._idle is not None and not any(c.task for c in self.connections):
            self._idle.set()

    def stop_accepting(self) -> None:
        """No new connections (the port closes); those open are still served, as in
        Triton's graceful stop, until their clients close them or `stop`."""
        if self._server is not None:
            self._server.close()

    async def stop(self, grace: float) -> None:
        """No new connections or requests; requests being served get `grace` seconds to
        finish, then they are cancelled and every connection is closed."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self.connections):
            conn.pending.clear()
            if conn.task is None:
                conn.transport.close()
        self._idle = asyncio.Event()
        self.check_idle()
        try:
            await asyncio.wait_for(self._idle.wait(), grace)
        except asyncio.TimeoutError:
            pass
        for conn in list(self.connections):
            if conn.task is not None:
                conn.task.cancel()
            conn.transport.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        if self.on_stop is not None:
            self.on_stop()
