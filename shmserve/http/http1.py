"""HTTP/1.1 server side for the REST and metrics endpoints: httptools (Node's llhttp parser)
reads requests, and the event loop's own protocol callbacks drive everything else
(keep-alive, pipelining in order, Expect: 100-continue, size limits, timeouts, chunked
responses for event streams).

Why not aiohttp, which served here before: on the 2-core reference machine it costs about
40 µs of CPU per request before a handler runs (perf/transport_floor.py), most of it
building request objects, header multidicts and a task chain this server never uses; the
same echo on httptools costs 16 µs. The front is one CPU-bound thread, so that difference is
HTTP throughput. Parsing HTTP is the part to leave to a library; the rest is small.
"""

import asyncio
import http
import logging
import time
from collections import deque

import httptools
import orjson

from shmserve import eager
from shmserve.fastpath.connection_loans import ConnectionLoans
from shmserve.fastpath.prepared_answers import WRITTEN_BY_WORKER

log = logging.getLogger("shmserve.http")

# The request line and headers together: more is refused (431) before anything is built.
MAX_HEAD_BYTES = 64 * 1024
# A request's head must arrive within this many seconds of its first byte, its body must not
# stop for longer than BODY_TIMEOUT_S, the whole request must arrive within REQUEST_TIMEOUT_S,
# and an idle connection (nothing in flight) is closed after KEEPALIVE_TIMEOUT_S: a client
# that trickles bytes cannot hold a connection for ever.
HEADERS_TIMEOUT_S = 30.0
BODY_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 300.0
KEEPALIVE_TIMEOUT_S = 75.0
# An error's text is cut to this many characters: it may quote what a client sent.
MAX_ERROR_CHARS = 4096
# A chunked body of more chunks than this is refused (400), as by Triton since 2.69: each
# chunk costs a call here.
MAX_CHUNKS = 65536
_SWEEP_INTERVAL_S = 1.0
# After refusing a request whose body it will not read, the connection reads and drops what
# the client still sends for this long before closing: a client that writes its whole body
# before reading gets the refusal instead of a reset.
LINGER_S = 5.0

# A request head longer than this is parsed every time (see _take_known): clients that repeat
# their heads send short ones.
MAX_KNOWN_HEAD = 4096
_LARGE_BODY = 64 * 1024  # written after the head instead of joined with it
# Response heads already written, by what they are made of: most answers repeat one.
_HEADS: dict = {}
MAX_KNOWN_RESPONSE_HEADS = 256
_STATUS_LINES = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode())
                 for s in http.HTTPStatus}


def _status_line(status: int) -> bytes:
    return _STATUS_LINES.get(status) or b"HTTP/1.1 %d Unknown\r\n" % status


class Request:
    """A complete request: its body is read before the handler runs. Header names are
    lower case; repeated headers are joined with ", "."""

    __slots__ = ("method", "path", "query", "headers", "body", "match_info", "begun_ns",
                 "closes", "_conn", "_stream")

    def __init__(self, method: str, path: str, query: str, headers: dict, body: bytes,
                 conn: "_Connection", begun_ns: int = 0):
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.match_info: dict = {}
        self.begun_ns = begun_ns  # time.perf_counter_ns() when its first bytes were parsed
        self.closes = False  # the connection closes after its answer
        self._conn = conn
        self._stream: "ChunkedStream | None" = None

    @property
    def connection(self) -> "_Connection":
        return self._conn

    def stream(self, headers: dict, status: int = 200) -> "ChunkedStream":
        """Start a response whose body follows in chunks (server-sent events)."""
        self._stream = ChunkedStream(self._conn, status, headers, self.method == "HEAD")
        return self._stream


class Response:
    __slots__ = ("status", "body", "headers", "on_sent")

    def __init__(self, status: int = 200, body=b"", content_type: str | None = None,
                 headers: dict | None = None):
        self.status = status
        self.body = body
        self.headers = headers if headers is not None else {}
        self.on_sent = None  # called once the response is handed to the socket
        if content_type is not None:
            self.headers["Content-Type"] = content_type


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


def error_response(status: int, message: str) -> Response:
    """Triton's error body, {"error": message}, the message cut to MAX_ERROR_CHARS."""
    if len(message) > MAX_ERROR_CHARS:
        message = message[:MAX_ERROR_CHARS] + "..."
    return Response(status, orjson.dumps({"error": message}), "application/json")


class ChunkedStream:
    """A response body written as it is produced (Transfer-Encoding: chunked); a writer
    waits while the client is not reading."""

    def __init__(self, conn: "_Connection", status: int, headers: dict, head_only: bool):
        self._conn = conn
        self._head_only = head_only
        self.ended = False
        fields = dict(headers)
        fields["Transfer-Encoding"] = "chunked"
        conn.write_head(status, fields)

    async def write(self, data: bytes) -> None:
        if self._head_only or not data:
            return
        conn = self._conn
        if conn.transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        conn.transport.writelines((b"%x\r\n" % len(data), data, b"\r\n"))
        await conn.drain()

    async def end(self) -> None:
        if not self.ended:
            self.ended = True
            if not self._head_only and not self._conn.transport.is_closing():
                self._conn.transport.write(b"0\r\n\r\n")


# A connection's phase, for the timeouts.
_IDLE, _HEAD, _BODY, _SERVING = range(4)


class _Refusal:
    """A request refused while it was read; answered in its turn, then the connection
    closes (its remaining bytes cannot be trusted to frame a next request)."""

    __slots__ = ("response",)

    def __init__(self, response: Response):
        self.response = response


class _Connection(asyncio.Protocol):
    def __init__(self, server: "HttpServer"):
        self.server = server
        self.loop = server.loop
        self.transport = None
        # Its socket as lent to models' workers, for the answers they write (the fast path):
        # while an answer is lent, the transport is a _HeldWrites.
        self.loans = ConnectionLoans(self)
        self.parser = httptools.HttpRequestParser(self)
        self.pending: deque = deque()  # requests read and not yet served, in order
        self.task: asyncio.Task | None = None
        self.phase = _IDLE
        self.since = self.loop.time()  # when the phase began
        self.refused = False  # stop parsing: the rest is dropped
        self.closing = False  # close once what is pending is answered
        self._expects_continue = False  # the request being read waits for 100 Continue
        self.reading_paused = False
        self._drained: asyncio.Future | None = None
        # The request being read.
        self._url = b""
        self._headers: dict = {}
        self._head_bytes = 0
        self._begun = 0  # requests whose first byte was read
        self._begun_ns = 0
        self._unfinished_head = 0  # bytes read into a header or trailer not yet complete
        self._body: list = []
        self._body_bytes = 0
        self._chunks = 0  # chunk headers of a chunked body
        # The body's progress as the last sweep saw it: ((request, bytes), when it moved).
        self._body_mark: tuple = ()
        self._body_moved = 0.0
        # The head of the last request that arrived alone in one read, and what it parsed
        # to; see _take_known.
        self._known_head = b""
        self._known: tuple = ()

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self.loans.fd = sock.fileno()
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        # Between requests the parser is at a request's start (it skips CR and LF there).
        between = self.phase == _IDLE or self.phase == _SERVING
        if between and self._known_head:
            data = self._take_known(data)
            if not data:
                self._serve_next()
                return
        phase = self.phase
        begun = self._begun
        body_bytes = self._body_bytes
        try:
            self.parser.feed_data(data)
            if between and self._begun == begun + 1 and self.phase == _SERVING \
                    and not self.refused:
                self._learn_head(data)
            if (self._begun == begun and self.phase == phase
                    and (phase == _HEAD or (phase == _BODY and self._body_bytes == body_bytes))):
                # The parser keeps an unfinished header (or chunked trailer) to itself: the
                # chunks that leave one unfinished are what bounds its memory.
                self._unfinished_head += len(data)
                if self._unfinished_head > MAX_HEAD_BYTES:
                    self._refuse(_head_too_large())
        except httptools.HttpParserUpgrade:
            # What follows the request is another protocol (see on_message_complete).
            self.refused = True
        except httptools.HttpParserError as exc:
            if not self.refused:
                self._refuse(error_response(400, f"malformed HTTP request: {exc}"))
        self._serve_next()

    def _learn_head(self, data: bytes) -> None:
        """Keep the head of the request just parsed when `data` held that request alone,
        and nothing in it asks for more than a plain request (a body of its Content-Length,
        kept alive, no 100 Continue)."""
        request = self.pending[-1]
        headers = request.headers
        head_length = len(data) - len(request.body)
        if head_length > MAX_KNOWN_HEAD or request.closes \
                or data.find(b"\r\n\r\n") + 4 != head_length \
                or "transfer-encoding" in headers or "expect" in headers \
                or headers.get("content-length", "0") != str(len(request.body)):
            return
        self._known_head = data[:head_length]
        self._known = (request.method, request.path, request.query, dict(headers),
                       len(request.body))

    def _take_known(self, data: bytes) -> bytes:
        """Serve the requests at the start of `data` that repeat the known head, without the
        parser: the same bytes parse to the same request and pass the same checks. What is
        left is for the parser, which these requests leave at a request's start."""
        head = self._known_head
        method, path, query, headers, length = self._known
        start = len(head)
        end = start + length
        while data.startswith(head) and len(data) >= end:
            self._begun += 1
            request = Request(method, path, query, headers.copy(), data[start:end], self,
                              time.perf_counter_ns())
            self.pending.append(request)
            self.phase = _SERVING
            if len(self.pending) > self.server.max_inflight and not self.reading_paused:
                self.reading_paused = True
                self.transport.pause_reading()
            data = data[end:]
        return data

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

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._begun += 1
        self._unfinished_head = 0
        self.phase = _HEAD
        self.since = self.loop.time()
        self._begun_ns = time.perf_counter_ns()
        self._url = b""
        self._headers = {}
        self._head_bytes = 0
        self._body = []
        self._body_bytes = 0
        self._chunks = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_bytes += len(url)
        if self._head_bytes > MAX_HEAD_BYTES:
            self._head_refused()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > MAX_HEAD_BYTES:
            self._head_refused()
        if self.phase == _BODY:
            return  # a chunked body's trailer: counted, not taken as a header
        key = name.decode("latin-1").lower()
        known = self._headers.get(key)
        text = value.decode("latin-1")
        self._headers[key] = text if known is None else known + ", " + text

    def _head_refused(self) -> None:
        self._refuse(_head_too_large())
        raise httptools.HttpParserError("head too large")  # stops the parser

    def on_headers_complete(self) -> None:
        self.phase = _BODY
        self._unfinished_head = 0
        headers = self._headers
        length = headers.get("content-length")
        limit = self.server.max_input_size
        if length is not None and length.isdigit() and int(length) > limit:
            self._refuse(error_response(400, _too_large(limit)))
            raise httptools.HttpParserError("body too large")
        coding = headers.get("transfer-encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            self._refuse(error_response(501, f"transfer coding '{coding}' is not supported: "
                                             f"send the body as it is, or chunked"))
            raise httptools.HttpParserError("transfer coding not supported")
        if self.parser.should_upgrade() and (coding is not None or length not in (None, "0")):
            # The parser would take the body for the upgraded protocol's bytes, and the
            # request would run without it.
            self._refuse(error_response(400, "a request that asks to upgrade the protocol "
                                             "cannot have a body: this server does not "
                                             "upgrade"))
            raise httptools.HttpParserError("upgrade with a body")
        if headers.get("expect", "").lower() == "100-continue" \
                and self.parser.get_http_version() == "1.1":
            self._expects_continue = True
            self._send_continue()

    def _send_continue(self) -> None:
        """The interim answer a request with `Expect: 100-continue` waits for, once every
        request before it has its final answer (else the client would take it for theirs)."""
        if self._expects_continue and self.task is None and not self.pending \
                and not self.transport.is_closing():
            self._expects_continue = False
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_chunk_header(self) -> None:
        self._chunks += 1
        if self._chunks > MAX_CHUNKS + 1:  # the last chunk, of size 0, ends the body
            self._refuse(error_response(400, f"Chunked request body exceeds maximum of "
                                             f"{MAX_CHUNKS} non-empty chunks. Send fewer or "
                                             f"larger HTTP chunks."))
            raise httptools.HttpParserError("too many chunks")

    def on_body(self, body: bytes) -> None:
        self._unfinished_head = 0
        self._body_bytes += len(body)
        if self._body_bytes > self.server.max_input_size:
            self._refuse(error_response(400, _too_large(self.server.max_input_size)))
            raise httptools.HttpParserError("body too large")
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._expects_continue = False
        body = self._body
        url = self._url
        # Absolute-form targets (http://host/path) are for proxies, but servers accept them.
        if url[:1] != b"/" or b"?" in url or b"#" in url:
            try:
                parsed = httptools.parse_url(url)
            except httptools.HttpParserInvalidURLError:
                # CONNECT's authority form (host:port), or no URL at all: nothing to route.
                self._refuse(error_response(
                    400, f"the request target '{url[:200].decode('latin-1')}' is not a path"))
                raise httptools.HttpParserError("request target not a path") from None
            path, query = parsed.path or b"", parsed.query or b""
        else:
            path, query = url, b""
        request = Request(self.parser.get_method().decode("ascii"),
                          path.decode("latin-1"), query.decode("latin-1"), self._headers,
                          body[0] if len(body) == 1 else b"".join(body), self, self._begun_ns)
        if not self.parser.should_keep_alive() or self.parser.should_upgrade():
            # The last request of the connection: what follows it is dropped (after an
            # upgrade, it is another protocol), and it is answered as if it had not asked to
            # upgrade. The requests before it keep the connection open in their answers.
            request.closes = True
            self.refused = True
        self.pending.append(request)
        self.phase = _SERVING
        if len(self.pending) > self.server.max_inflight and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()

    def _refuse(self, response: Response) -> None:
        self.refused = True
        self.pending.append(_Refusal(response))
        self.phase = _SERVING

    # Serving, one request at a time so that answers leave in request order. Pipelined
    # requests wait their turn (the connection is not read while more than max_inflight
    # wait), and none is served while the client is not reading the answers.
    def _serve_next(self) -> None:
        while self.task is None and self.pending and not self.transport.is_closing():
            if self._drained is not None and not self._drained.done():
                break  # resume_writing serves on
            item = self.pending.popleft()
            if type(item) is _Refusal:
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
            elif self.phase == _SERVING:  # not when the next request is half read
                self.phase = _IDLE
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
                pass
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
    def lendable(self) -> bool:
        """Whether an answer on this connection may be written by a model's worker: not one
        that must say the connection closes (a head prepared earlier would not say it)."""
        return self.loans.lendable and not (self.closing or self.server.stopping
                                             or self.transport.is_closing())

    # Its socket lent to a model's worker (fastpath/connection_loans.py's LoanHooks): one
    # answer at a time, unframed; what this side writes meanwhile waits (_HeldWrites).
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

    def head(self, status: int, headers: dict, length: int | None) -> bytes:
        closes = self.closing or self.server.stopping
        key = (status, length, closes, *headers.items())
        head = _HEADS.get(key)
        if head is None:
            head = _HEADS[key] = self._build_head(status, headers, length, closes)
            if len(_HEADS) > MAX_KNOWN_RESPONSE_HEADS:
                _HEADS.clear()
        return head

    @staticmethod
    def _build_head(status: int, headers: dict, length: int | None, closes: bool) -> bytes:
        parts = [_status_line(status)]
        for name, value in headers.items():
            parts.append(b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1")))
        if length is not None:
            parts.append(b"Content-Length: %d\r\n" % length)
        if closes:
            parts.append(b"Connection: close\r\n")
        parts.append(b"\r\n")
        return b"".join(parts)

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
        self.phase = _IDLE
        self.since = self.loop.time()

    def check_timeouts(self, now: float) -> None:
        phase = self.phase
        if phase == _HEAD and now - self.since > HEADERS_TIMEOUT_S:
            self._time_out(f"the request headers did not arrive within {HEADERS_TIMEOUT_S:g} s")
        elif phase == _BODY:
            mark = (self._begun, self._body_bytes)
            if mark != self._body_mark:
                self._body_mark = mark
                self._body_moved = now
            elif now - self._body_moved > BODY_TIMEOUT_S:
                self._time_out(f"the request body stopped for {BODY_TIMEOUT_S:g} s")
            elif now - self.since > REQUEST_TIMEOUT_S:
                self._time_out(f"the request did not arrive within {REQUEST_TIMEOUT_S:g} s")
        elif phase == _IDLE and now - self.since > KEEPALIVE_TIMEOUT_S:
            self.transport.close()

    def _time_out(self, why: str) -> None:
        self.refused = True
        self.pending.clear()
        if self.task is None:
            self.closing = True
            self.write_response(None, error_response(408, why))
        self.transport.close()


def _head_too_large() -> Response:
    return error_response(431, f"the request line and headers exceed {MAX_HEAD_BYTES} bytes, "
                               f"or a chunked body's trailer does")


def _too_large(limit: int) -> str:
    # 400 as Triton answers it (its INVALID_ARG), with the limit's flag named.
    return (f"request body exceeds the maximum input size (--http-max-input-size) of "
            f"{limit} bytes")


class HttpServer:
    """Serves `handle` (async: Request -> Response, or None after `request.stream()`) on
    one TCP address. Once more than `max_inflight` requests of one connection wait behind
    the one being served, the connection is not read until they are down to half."""

    def __init__(self, handle, max_input_size: int, max_inflight: int = 64, on_stop=None):
        self.handle = handle
        self.on_stop = on_stop
        self.max_input_size = max_input_size
        self.max_inflight = max(1, max_inflight)
        self.connections: set = set()
        self.stopping = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._idle: asyncio.Event | None = None

    async def start(self, host: str, port: int) -> None:
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(lambda: _Connection(self), host, port,
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
