"""Reading HTTP/1.1 requests: httptools (Node's llhttp) parses, and its callbacks build each
Request, with the limits that keep what a client sends in proportion (the head's size, the
body's, chunks), the timeouts that keep a client that trickles bytes from holding a
connection, and the interim 100 Continue.

RequestReader is a part of http1_connection.Connection, which serves what it reads in order
(`pending`); a request refused while it was read takes its place there as a Refusal.
"""

import time

import httptools

from shmserve.http.http1_messages import Request, Response, error_response

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
# A chunked body of more chunks than this is refused (400), as by Triton since 2.69: each
# chunk costs a call here.
MAX_CHUNKS = 65536

# A connection's phase, for the timeouts.
IDLE, HEAD, BODY, SERVING = range(4)


class Refusal:
    """A request refused while it was read; answered in its turn, then the connection
    closes (its remaining bytes cannot be trusted to frame a next request)."""

    __slots__ = ("response",)

    def __init__(self, response: Response):
        self.response = response


class RequestReader:
    """The connection's httptools callbacks, and its `data_received`."""

    def _init_reading(self) -> None:
        self.phase = IDLE
        self.since = self.loop.time()  # when the phase began
        self.refused = False  # stop parsing: the rest is dropped
        self._expects_continue = False  # the request being read waits for 100 Continue
        self.parser = httptools.HttpRequestParser(self)
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
        self._init_repeated_heads()

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        # Between requests the parser is at a request's start (it skips CR and LF there).
        between = self.phase == IDLE or self.phase == SERVING
        if between and self._known_head:  # the fast path: a head that repeats
            data = self._take_known(data)
            if not data:
                self._serve_next()
                return
        phase = self.phase
        begun = self._begun
        body_bytes = self._body_bytes
        try:
            self.parser.feed_data(data)
            if between and self._begun == begun + 1 and self.phase == SERVING \
                    and not self.refused:
                self._learn_head(data)  # the fast path: a head that may repeat
            if (self._begun == begun and self.phase == phase
                    and (phase == HEAD or (phase == BODY and self._body_bytes == body_bytes))):
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

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._begun += 1
        self._unfinished_head = 0
        self.phase = HEAD
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
        if self.phase == BODY:
            return  # a chunked body's trailer: counted, not taken as a header
        key = name.decode("latin-1").lower()
        known = self._headers.get(key)
        text = value.decode("latin-1")
        self._headers[key] = text if known is None else known + ", " + text

    def _head_refused(self) -> None:
        self._refuse(_head_too_large())
        raise httptools.HttpParserError("head too large")  # stops the parser

    def on_headers_complete(self) -> None:
        self.phase = BODY
        self._unfinished_head = 0
        headers = self._headers
        length = headers.get("content-length")
        limit = self.server.max_input_size
        if length is not None and length.isdigit() and int(length) > limit:
            self._refuse(self.server.too_large(self._url, int(length), limit))
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
            self._refuse(self.server.too_large(self._url, self._body_bytes,
                                               self.server.max_input_size))
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
        self.phase = SERVING
        if len(self.pending) > self.server.max_inflight and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()

    def _refuse(self, response: Response) -> None:
        self.refused = True
        self.pending.append(Refusal(response))
        self.phase = SERVING

    # Timeouts
    def check_timeouts(self, now: float) -> None:
        phase = self.phase
        if phase == HEAD and now - self.since > HEADERS_TIMEOUT_S:
            self._time_out(f"the request headers did not arrive within {HEADERS_TIMEOUT_S:g} s")
        elif phase == BODY:
            mark = (self._begun, self._body_bytes)
            if mark != self._body_mark:
                self._body_mark = mark
                self._body_moved = now
            elif now - self._body_moved > BODY_TIMEOUT_S:
                self._time_out(f"the request body stopped for {BODY_TIMEOUT_S:g} s")
            elif now - self.since > REQUEST_TIMEOUT_S:
                self._time_out(f"the request did not arrive within {REQUEST_TIMEOUT_S:g} s")
        elif phase == IDLE and now - self.since > KEEPALIVE_TIMEOUT_S:
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


def triton_too_large(url: bytes, size: int, limit: int) -> Response:
    """HttpServer's answer to a body over the limit unless told another."""
    return error_response(400, _too_large(limit))


def _too_large(limit: int) -> str:
    # 400 as Triton answers it (its INVALID_ARG), with the limit's flag named.
    return (f"request body exceeds the maximum input size (--http-max-input-size) of "
            f"{limit} bytes")
