"""A raw keep-alive HTTP/1.1 connection: requests written as bytes (pipelined, cut short, one byte
at a time), the responses and the connection's end read back."""
import asyncio
import time


def parse_http1(buf: bytearray) -> list[tuple[int, dict, bytes]]:
    """The complete responses at the front of buf, removed from it: (status, headers, body)."""
    out = []
    while True:
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return out
        lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
        try:
            status = int(lines[0].split()[1])
        except (IndexError, ValueError):
            status = -1
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        start = end + 4
        if "content-length" in headers:
            stop = start + int(headers["content-length"])
            if len(buf) < stop:
                return out
            body, consumed = bytes(buf[start:stop]), stop
        elif "chunked" in headers.get("transfer-encoding", ""):
            term = buf.find(b"0\r\n\r\n", start)
            if term < 0:
                return out
            body, consumed = bytes(buf[start:term]), term + 5
        else:
            body, consumed = b"", start
        out.append((status, headers, body))
        del buf[:consumed]


class Http1Conn:
    """A raw keep-alive HTTP/1.1 connection: what we write, and the responses and the end we read."""

    def __init__(self, port: int, t0: float):
        self.port, self.t0 = port, t0
        self.buf = bytearray()
        self.responses: list[tuple[float, int, dict, bytes]] = []   # (at, status, headers, body)
        self.closed_at: float | None = None
        self.close_how = ""
        self.changed = asyncio.Event()
        self.writer = self.task = None

    async def open(self, timeout: float = 5.0) -> None:
        reader, self.writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.port), timeout)
        self.task = asyncio.ensure_future(self._read_loop(reader))

    async def _read_loop(self, reader) -> None:
        try:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    self._ended("closed by the server")
                    return
                self.buf += data
                now = time.monotonic() - self.t0
                self.responses += [(now, *r) for r in parse_http1(self.buf)]
                self._wake()
        except (ConnectionError, OSError) as e:
            self._ended(f"reset ({type(e).__name__})")
        finally:
            self._ended("closed")

    def _ended(self, how: str) -> None:
        if self.closed_at is None:
            self.closed_at, self.close_how = time.monotonic() - self.t0, how
        self._wake()

    def _wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def write(self, data: bytes) -> None:
        if self.closed_at is None and not self.writer.transport.is_closing():
            self.writer.write(data)

    async def wait(self, n_responses: int, deadline: float) -> bool:
        """Until n responses came, the connection ended, or the deadline."""
        while len(self.responses) < n_responses and self.closed_at is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self.changed.wait(), remaining)
            except asyncio.TimeoutError:
                pass
        return len(self.responses) >= n_responses

    def close(self) -> None:
        if self.writer is not None:
            self.writer.transport.abort()
        if self.task is not None:
            self.task.cancel()
        if self.closed_at is None:
            self.closed_at, self.close_how = time.monotonic() - self.t0, "closed by us"

    def describe(self) -> str:
        out = []
        if self.responses:
            at, status, _, body = self.responses[0]
            text = body[:60].decode("utf-8", "replace").replace("\n", " ")
            out.append(f"HTTP {status} after {at:.1f} s" + (f": {text}" if text else ""))
        if self.closed_at is not None and self.close_how != "closed by us":
            out.append(f"connection {self.close_how} at {self.closed_at:.1f} s")
        return "; ".join(out)


def http_request(method: str, path: str, port: int, body: bytes = b"", headers: tuple = ()) -> bytes:
    head = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    if body or method == "POST":
        head.append(f"Content-Length: {len(body)}")
    head += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body
