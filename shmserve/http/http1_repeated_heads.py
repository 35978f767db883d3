"""Request heads that repeat byte for byte, recognised without the parser (the fast path,
docs/fast-path.md).

A client that repeats its request sends the same head each time (the same method, path,
headers and Content-Length). The head of the last request that arrived alone in one read is
kept, with what it parsed to; requests that start with those bytes are served without the
parser: the same bytes parse to the same request and pass the same checks. RepeatedHeads is a
part of http1_connection.Connection, called at the two places in http1_reader.RequestReader
that say so; without it every request is parsed.
"""

import time

from shmserve.http.http1_messages import Request
from shmserve.http.http1_reader import SERVING

# A request head longer than this is parsed every time (see _take_known): clients that repeat
# their heads send short ones.
MAX_KNOWN_HEAD = 4096


class RepeatedHeads:
    """The connection's known head: learnt from a request that came alone, and taken at the
    start of each read between requests."""

    def _init_repeated_heads(self) -> None:
        # The head of the last request that arrived alone in one read, and what it parsed
        # to; see _take_known.
        self._known_head = b""
        self._known: tuple = ()

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
            self.phase = SERVING
            if len(self.pending) > self.server.max_inflight and not self.reading_paused:
                self.reading_paused = True
                self.transport.pause_reading()
            data = data[end:]
        return data
