"""One HTTP/1.1 connection, driven by the event loop's protocol callbacks: requests served one
at a time, in order (pipelined ones wait their turn), keep-alive, and writing the answers.

The connection is one object whose parts are classes of their own modules, each for one
concern: reading requests (http1_reader.RequestReader), and two parts of the fast path
(docs/fast-path.md), request heads that repeat (http1_repeated_heads.RepeatedHeads) and the
loans of the socket to model workers (http1_loans.LentSocket). They share the connection's
state, which each sets up in its own `_init_*` method.
"""

import asyncio
import logging
from collections import deque

from shmserve import eager
from shmserve.fastpath.connection_loans import ConnectionLoans
from shmserve.fastpath.prepared_answers import WRITTEN_BY_WORKER
from shmserve.http.http1_loans import LentSocket
from shmserve.http.http1_messages import Request, Response, error_response, response_head
from shmserve.http.http1_reader import IDLE, SERVING, Refusal, RequestReader
from shmserve.http.http1_repeated_heads import RepeatedHeads

log = logging.getLogger("shmserve.http")

# After refusing a request whose body it will not read, the connection reads and drops what
# the client still sends for this long before closing: a client that writes its whole body
# before reading gets the refusal instead of a reset.
LINGER_S = 5.0
_LARGE_BODY = 64 * 1024  # written after the head instead of joined with it


class Connection(RequestReader, RepeatedHeads, LentSocket, asyncio.Protocol):
    def __init__(self, server):
        """`server`: its http1.HttpServer."""
        self.server = server
        self.loop = server.loop
        self.transport = None
        # Its socket as lent to models' workers, for the answers they write (the fast path):
        # while an answer is lent, the transport is a http1_loans._HeldWrites.
        self.loans = ConnectionLoans(self)
        self.pending: deque = deque()  # requests read and not yet served, in order
        self.task: asyncio.Task | None = None
        self.closing = False  # close once what is pending is answered
        self.reading_paused = False
        self._drained: asyncio.Future | None = None
        self._init_reading()

    # asyncio.Protocol (data_received is RequestReader's)
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self.loans.fd = sock.fileno()
        self.server.connections.add(self)

    def eof_received(self) -> bool:
        # The client's end of input closes the connection and cancels its requests: a
        # half-closed socket looks the same as a client that went away, and the work of a
        # client that went away must stop at once.
        return False

    def connection_lost(self, exc) -> None:
        self.server.connections.discard(self)
        self.pending.clear()
        if self.task is not None:
            self.task.cancel()  # a client that went away cancels its request
        self.server.check_idle()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self) -> None:
        if self._drained is None or self._drained.done():
            self._drained = self.loop.create_future()

    def resume_writing(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
            if self.task is None and not self.transport.is_closing():
                self._serve_next()  # what waited for the client to read (see _serve_next)

    async def drain(self) -> None:
        if self._drained is not None and not self._drained.done():
            await self._drained

    # Serving, one request at a time so that answers leave in request order. Pipelined
    # requests wait their turn (the connection is not read while more than max_inflight
    # wait), and none is served while the client is not reading the answers.
    def _serve_next(self) -> None:
        while self.task is None and self.pending and not self.transport.is_closing():
            if self._drained is not None and not self._drained.done():
                break  # resume_writing serves on
            item = self.pending.popleft()
            if type(item) is Refusal:
                self._answer_refusal(item.response)
                return
            if item.closes:
                self.closing = True
            # Started now, so the request reaches its scheduler in this turn of the loop; one
            # answered at once (a health check) lets the next pipelined one start too.
            task = eager.start(self._serve(item), self.loop)
            if not task.done():
                self.task = task
                task.add_done_callback(self._served)
        if self.task is None and not self.pending:
            self.server.check_idle()
            if self.closing or self.server.stopping:
                self.transport.close()
            elif self.phase == SERVING:  # not when the next request is half read
                self.phase = IDLE
                self.since = self.loop.time()
            else:
                self._send_continue()
        if self.reading_paused and len(self.pending) <= self.server.max_inflight // 2:
            self.reading_paused = False
            self.transport.resume_reading()

    def _served(self, _task) -> None:
        # The task was cleared as it ended (see _serve); the next request may have started.
        self.server.check_idle()
        if not self.transport.is_closing():
            self._serve_next()

    async def _serve(self, request: Request) -> None:
        try:
            try:
                response = await self.server.handle(request)
            except Exception as exc:
                if self.transport.is_closing():
                    return  # the client left while its answer was written
                log.exception("HTTP handler failed: %s", exc)
                response = error_response(500, f"internal error: {exc}")
            stream = request._stream
            if stream is not None:
                await stream.end()
            elif response is WRITTEN_BY_WORKER:
                pass  # the fast path: the model's worker wrote the answer
            elif response is not None:
                self.write_response(request, response)
                if response.on_sent is not None:
                    response.on_sent()
            else:
                self.write_response(request, error_response(500, "the handler sent nothing"))
            if self._drained is not None:  # the transport paused writing at some point
                await self.drain()
        finally:
            # At once, not in _served's turn: the client's next request may come first.
            self.task = None

    # Writing
    def head(self, status: int, headers: dict, length: int | None) -> bytes:
        return response_head(status, headers, length, self.closing or self.server.stopping)

    def write_head(self, status: int, headers: dict) -> None:
        self.transport.write(self.head(status, headers, None))

    def write_response(self, request: Request | None, response: Response) -> None:
        if self.transport.is_closing():
            return
        body = response.body
        head = self.head(response.status, response.headers, len(body))
        if request is not None and request.method == "HEAD":
            self.transport.write(head)
        elif len(body) >= _LARGE_BODY:
            self.transport.writelines((head, body))
        else:  # one write: the usual answer is a few hundred bytes
            self.transport.write(head + body)

    def _answer_refusal(self, response: Response) -> None:
        self.closing = True
        if self.transport.is_closing():
            return
        self.write_response(None, response)
        # The client sees the end of the answer at once; what it still sends is read and
        # dropped for a while, then the connection closes.
        if self.transport.can_write_eof():
            self.transport.write_eof()
        if self.reading_paused:
            self.reading_paused = False
            self.transport.resume_reading()
        self.loop.call_later(LINGER_S, self.transport.close)
        self.phase = IDLE
        self.since = self.loop.time()
