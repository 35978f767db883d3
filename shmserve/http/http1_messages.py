"""HTTP/1.1 messages as the endpoints see them: the Request a handler gets (its body read
whole), the Response it returns, a ChunkedStream for a body written as it is produced (event
streams), Triton's error body, and the bytes of a response head.

The server side that reads and writes them is http1.py (HttpServer, and its connections in
http1_connection.py).
"""

import http
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from shmserve.http.http1_connection import Connection

# An error's text is cut to this many characters: it may quote what a client sent.
MAX_ERROR_CHARS = 4096

# Response heads already written, by what they are made of: most answers repeat one.
_HEADS: dict = {}
MAX_KNOWN_RESPONSE_HEADS = 256
_STATUS_LINES = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode())
                 for s in http.HTTPStatus}


class Request:
    """A complete request: its body is read before the handler runs. Header names are
    lower case; repeated headers are joined with ", "."""

    __slots__ = ("method", "path", "query", "headers", "body", "match_info", "begun_ns",
                 "closes", "_conn", "_stream")

    def __init__(self, method: str, path: str, query: str, headers: dict, body: bytes,
                 conn: "Connection", begun_ns: int = 0):
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
    def connection(self) -> "Connection":
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


def error_response(status: int, message: str) -> Response:
    """Triton's error body, {"error": message}, the message cut to MAX_ERROR_CHARS."""
    if len(message) > MAX_ERROR_CHARS:
        message = message[:MAX_ERROR_CHARS] + "..."
    return Response(status, orjson.dumps({"error": message}), "application/json")


class ChunkedStream:
    """A response body written as it is produced (Transfer-Encoding: chunked); a writer
    waits while the client is not reading."""

    def __init__(self, conn: "Connection", status: int, headers: dict, head_only: bool):
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


def response_head(status: int, headers: dict, length: int | None, closes: bool) -> bytes:
    """A response head: its status line, `headers`, Content-Length unless `length` is None,
    and Connection: close when the connection `closes` after it."""
    key = (status, length, closes, *headers.items())
    head = _HEADS.get(key)
    if head is None:
        head = _HEADS[key] = _build_head(status, headers, length, closes)
        if len(_HEADS) > MAX_KNOWN_RESPONSE_HEADS:
            _HEADS.clear()
    return head


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


def _status_line(status: int) -> bytes:
    return _STATUS_LINES.get(status) or b"HTTP/1.1 %d Unknown\r\n" % status
