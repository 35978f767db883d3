"""A raw HTTP/2 client connection, written frame by frame (struct, and hpack for header blocks),
so that an attacker can break the protocol where a library would refuse to; what the server
sent back is parsed and described (GOAWAY, RST_STREAM, grpc-status, the connection's end)."""
import asyncio
import collections
import struct
import time
import urllib.parse
from typing import Callable

import hpack

from .payloads import MIB, ZEROS


INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
SERVICE = "/inference.GRPCInferenceService/"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


# HTTP/2 frame types, flags, settings and error codes (RFC 9113).
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
S_MAX_CONCURRENT_STREAMS, S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE = 3, 4, 5
H2_ERRORS = ("NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR", "SETTINGS_TIMEOUT",
             "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL", "COMPRESSION_ERROR",
             "CONNECT_ERROR", "ENHANCE_YOUR_CALM", "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED")
CANCEL = 8
GRPC_CODES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
              "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
              "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
              "UNAUTHENTICATED")


def h2_error(code: int) -> str:
    return H2_ERRORS[code] if 0 <= code < len(H2_ERRORS) else f"error 0x{code:x}"


def grpc_code(code: int) -> str:
    return f"{code} {GRPC_CODES[code] if 0 <= code < len(GRPC_CODES) else '?'}"


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">IBI", (len(payload) << 8) | ftype, flags, sid) + payload


def settings_frame(settings: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in settings.items()))


class Stream:
    __slots__ = ("sid", "send_window", "blocks", "rst", "ended", "data_bytes", "body", "keep_body",
                 "reset_by_us")

    def __init__(self, sid: int, send_window: int):
        self.sid, self.send_window = sid, send_window
        self.blocks: list[dict[str, str]] = []   # header blocks: headers, then trailers
        self.rst: int | None = None
        self.ended = False
        self.data_bytes = 0
        self.body = bytearray()
        self.keep_body = False
        self.reset_by_us = False

    def header(self, name: str) -> str | None:
        for block in reversed(self.blocks):
            if name in block:
                return block[name]
        return None

    @property
    def finished(self) -> bool:
        return self.ended or self.rst is not None


class H2Conn:
    """An HTTP/2 connection we write frame by frame. A reader task parses what the server sends:
    SETTINGS (acknowledged unless ack_settings is False), PING (answered unless ack_pings is
    False), WINDOW_UPDATE (our send windows), HEADERS/CONTINUATION (decoded), DATA (counted, and
    the windows opened again unless window_updates is False), RST_STREAM, GOAWAY, and when the
    connection ended. Times are seconds since t0 (the case's start)."""

    def __init__(self, port: int, t0: float, *, settings: dict[int, int] | None = None,
                 ack_settings: bool = True, ack_pings: bool = True, window_updates: bool = True):
        self.port, self.t0 = port, t0
        self.our_settings = settings or {}
        self.ack_settings, self.ack_pings, self.window_updates = ack_settings, ack_pings, window_updates
        self.server_settings: dict[int, int] = {}
        self.max_frame = 16384
        self.initial_window = 65535   # the server's, for what we send
        self.conn_window = 65535
        self.streams: dict[int, Stream] = {}
        self.next_sid = 1
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder(max_header_list_size=1 << 28)
        self.decoder.max_allowed_table_size = 1 << 20
        self.goaway: tuple[float, int, int, str] | None = None   # (at, last stream, code, debug)
        self.closed_at: float | None = None
        self.close_how = ""
        self.settings_acks = self.ping_acks = self.pings = 0
        self.got_settings = asyncio.Event()
        self._changed = asyncio.Event()
        self._block: tuple[int, int, bytearray] | None = None   # (sid, flags, bytes) of a header block
        self.reader = self.writer = self.task = None

    # -- connection
    async def open(self, timeout: float = 5.0, preface: bool = True) -> None:
        self.reader, self.writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", self.port, limit=1 << 26), timeout)
        if preface:
            self.write(PREFACE + settings_frame(self.our_settings))
        self.task = asyncio.ensure_future(self._read_loop())
        if preface:
            await asyncio.wait_for(self.got_settings.wait(), timeout)

    def dead(self) -> bool:
        return self.closed_at is not None

    def now(self) -> float:
        return time.monotonic() - self.t0

    def close(self) -> None:
        if self.writer is not None:
            self.writer.transport.abort()
        if self.task is not None:
            self.task.cancel()
        if self.closed_at is None:
            self.closed_at, self.close_how = self.now(), "closed by us"

    def write(self, data) -> None:
        if not self.dead() and not self.writer.transport.is_closing():
            self.writer.write(data)

    async def drain(self, deadline: float) -> bool:
        """Wait until the kernel took what we wrote; False when the deadline passed first or the
        connection is gone."""
        if self.dead():
            return False
        try:
            await asyncio.wait_for(self.writer.drain(), max(deadline - time.monotonic(), 0.001))
            return True
        except (asyncio.TimeoutError, ConnectionError, OSError):
            return False

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_until(self, predicate: Callable[[], bool], deadline: float) -> bool:
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                return predicate()
        return True

    # -- reading
    async def _read_loop(self) -> None:
        try:
            while True:
                head = await self.reader.readexactly(9)
                length = int.from_bytes(head[:3], "big")
                payload = await self.reader.readexactly(length) if length else b""
                self._on_frame(head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF, payload)
                self._notify()
        except asyncio.IncompleteReadError as e:
            self._ended("closed by the server" if not e.partial else "closed mid-frame")
        except (ConnectionError, OSError) as e:
            self._ended(f"reset ({type(e).__name__})")
        except hpack.HPACKError as e:
            self._ended(f"undecodable header block from the server: {e}")
        finally:
            self._ended("closed")
            self.got_settings.set()

    def _ended(self, how: str) -> None:
        if self.closed_at is None:
            self.closed_at, self.close_how = self.now(), how
        self._notify()

    def stream(self, sid: int) -> Stream:
        s = self.streams.get(sid)
        if s is None:
            s = self.streams[sid] = Stream(sid, self.initial_window)
        return s

    def _on_frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if ftype == DATA:
            s = self.stream(sid)
            data = _unpad(payload, flags)
            s.data_bytes += len(data)
            if s.keep_body and len(s.body) < 1 << 20:
                s.body += data
            if flags & END_STREAM:
                s.ended = True
            if self.window_updates and payload:
                increment = struct.pack(">I", len(payload))
                out = frame(WINDOW_UPDATE, 0, 0, increment)
                if not s.finished and not s.reset_by_us:
                    out += frame(WINDOW_UPDATE, 0, sid, increment)
                self.write(out)
        elif ftype == HEADERS:
            block = _unpad(payload, flags)
            if flags & PRIORITY_FLAG:
                block = block[5:]
            self._block = (sid, flags, bytearray(block))
            if flags & END_HEADERS:
                self._end_block()
        elif ftype == CONTINUATION and self._block is not None:
            self._block[2].extend(payload)
            if flags & END_HEADERS:
                self._end_block()
        elif ftype == RST_STREAM:
            self.stream(sid).rst = int.from_bytes(payload[:4], "big")
        elif ftype == SETTINGS:
            if flags & ACK:
                self.settings_acks += 1
                return
            for i in range(0, len(payload) - 5, 6):
                key, value = struct.unpack_from(">HI", payload, i)
                self.server_settings[key] = value
                if key == S_INITIAL_WINDOW_SIZE:
                    delta, self.initial_window = value - self.initial_window, value
                    for s in self.streams.values():
                        s.send_window += delta
                elif key == S_MAX_FRAME_SIZE:
                    self.max_frame = value
            if self.ack_settings:
                self.write(frame(SETTINGS, ACK, 0))
            self.got_settings.set()
        elif ftype == PING:
            if flags & ACK:
                self.ping_acks += 1
            else:
                self.pings += 1
                if self.ack_pings:
                    self.write(frame(PING, ACK, 0, payload))
        elif ftype == GOAWAY:
            last, code = struct.unpack_from(">II", payload)
            debug = payload[8:200].decode("utf-8", "replace")
            self.goaway = (self.now(), last & 0x7FFFFFFF, code, debug)
        elif ftype == WINDOW_UPDATE:
            increment = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            if sid == 0:
                self.conn_window += increment
            else:
                self.stream(sid).send_window += increment

    def _end_block(self) -> None:
        sid, flags, block = self._block
        self._block = None
        s = self.stream(sid)
        s.blocks.append({k: v for k, v in self.decoder.decode(bytes(block))})
        if flags & END_STREAM:
            s.ended = True

    # -- writing
    def request_headers(self, path: str, extra: tuple = ()) -> list[tuple[str, str]]:
        return [(":method", "POST"), (":scheme", "http"), (":path", path),
                (":authority", f"127.0.0.1:{self.port}"), ("content-type", "application/grpc"),
                ("te", "trailers"), *extra]

    def header_frames(self, sid: int, block: bytes, end_stream: bool = False,
                      end_headers: bool = True) -> bytes:
        """HEADERS and the CONTINUATIONs after it, each within the server's frame size."""
        size = self.max_frame
        parts = [block[i:i + size] for i in range(0, len(block), size)] or [b""]
        out = []
        for i, part in enumerate(parts):
            last = end_headers and i == len(parts) - 1
            flags = (END_HEADERS if last else 0)
            if i == 0:
                out.append(frame(HEADERS, flags | (END_STREAM if end_stream else 0), sid, part))
            else:
                out.append(frame(CONTINUATION, flags, sid, part))
        return b"".join(out)

    def new_stream(self) -> Stream:
        sid, self.next_sid = self.next_sid, self.next_sid + 2
        return self.stream(sid)

    def open_stream(self, path: str = INFER, extra: tuple = (), end_stream: bool = False) -> int:
        """HEADERS of a gRPC call (written, not drained); its stream ID."""
        s = self.new_stream()
        self.write(self.header_frames(s.sid, self.encoder.encode(self.request_headers(path, extra)),
                                      end_stream))
        return s.sid

    def reset(self, sid: int, code: int = CANCEL) -> None:
        self.stream(sid).reset_by_us = True
        self.write(frame(RST_STREAM, 0, sid, struct.pack(">I", code)))

    async def send_data(self, sid: int, data: bytes | None = None, size: int = 0, *,
                        end_stream: bool, deadline: float) -> int:
        """DATA frames carrying `data` (or `size` zero bytes) within the server's windows, waiting
        for its WINDOW_UPDATEs; stops at the deadline, on RST_STREAM or a closed connection.
        Returns the bytes sent."""
        total = len(data) if data is not None else size
        s = self.stream(sid)
        view = memoryview(data) if data is not None else memoryview(ZEROS)
        pos = 0
        if total == 0 and end_stream:
            self.write(frame(DATA, END_STREAM, sid))
        while pos < total:
            if self.dead() or s.rst is not None:
                break
            n = min(self.conn_window, s.send_window, total - pos, 4 * MIB)
            if n <= 0:
                if not await self.wait_until(lambda: self.dead() or s.rst is not None
                                             or min(self.conn_window, s.send_window) > 0, deadline):
                    break
                continue
            parts, end = [], pos + n
            while pos < end:
                k = min(self.max_frame, end - pos)
                flags = END_STREAM if end_stream and pos + k == total else 0
                parts.append(struct.pack(">IBI", (k << 8) | DATA, flags, sid))
                parts.append(view[pos:pos + k] if data is not None else view[:k])
                pos += k
            self.conn_window -= n
            s.send_window -= n
            self.write(b"".join(parts))
            if not await self.drain(deadline):
                break
        return pos

    async def unary(self, path: str, message: bytes, deadline: float, extra: tuple = ()) -> Stream:
        """One gRPC call, waited for until it finishes or the deadline."""
        sid = self.open_stream(path, extra)
        await self.send_data(sid, message, end_stream=True, deadline=deadline)
        s = self.stream(sid)
        await self.wait_until(lambda: s.finished or self.dead(), deadline)
        return s

    # -- describing what happened
    def events(self) -> str:
        """The connection's end, if it ended: GOAWAY and/or closed, with when."""
        out = []
        if self.goaway:
            at, last, code, debug = self.goaway
            out.append(f"GOAWAY {h2_error(code)}" + (f" ({debug[:60]})" if debug else "")
                       + f" at {at:.1f} s")
        if self.closed_at is not None and self.close_how != "closed by us":
            out.append(f"{self.close_how} at {self.closed_at:.1f} s")
        return ", ".join(out)

    def outcome(self, sid: int, waited: float | None = None) -> str:
        """What one stream got: a grpc-status, an HTTP status, RST_STREAM, or nothing."""
        s = self.stream(sid)
        status = s.header("grpc-status")
        if status is not None:
            message = urllib.parse.unquote(s.header("grpc-message") or "")
            return f"grpc-status {grpc_code(int(status))}" + (f": {message[:60]}" if message else "")
        http = s.header(":status")
        if http is not None and http != "200":
            return f"HTTP {http}"
        if s.rst is not None:
            return f"RST_STREAM {h2_error(s.rst)}"
        if self.goaway and sid > self.goaway[1]:
            return "refused by GOAWAY"
        if self.dead() and self.close_how != "closed by us":
            return "connection ended"
        if s.data_bytes:
            return f"{s.data_bytes} bytes of response, unfinished"
        return "no answer" + (f" in {waited:.0f} s" if waited is not None else "")

    def describe(self, sids, waited: float | None = None) -> str:
        """The connection's end and the streams' outcomes, counted: 'GOAWAY ... at 0.1 s;
        1990× RST_STREAM REFUSED_STREAM, 10× no answer'."""
        counts = collections.Counter(self.outcome(sid, waited) for sid in sids)
        streams = ", ".join((f"{n}× {what}" if n > 1 or len(counts) > 1 else what)
                            for what, n in counts.most_common(4))
        if len(counts) > 4:
            streams += f", {len(counts) - 4} other answers"
        return "; ".join(x for x in (self.events(), streams) if x)


def _unpad(payload: bytes, flags: int) -> bytes:
    if flags & PADDED and payload:
        return payload[1:len(payload) - payload[0]]
    return payload


def parse_frames(buf: bytes) -> list[tuple[int, int, int, bytes]]:
    """The complete frames in buf: (type, flags, stream, payload)."""
    out, pos = [], 0
    while pos + 9 <= len(buf):
        length = int.from_bytes(buf[pos:pos + 3], "big")
        if pos + 9 + length > len(buf):
            break
        out.append((buf[pos + 3], buf[pos + 4], int.from_bytes(buf[pos + 5:pos + 9], "big") & 0x7FFFFFFF,
                    bytes(buf[pos + 9:pos + 9 + length])))
        pos += 9 + length
    return out


def goaway_text(payload: bytes) -> str:
    debug = payload[8:200].decode("utf-8", "replace")
    return f"GOAWAY {h2_error(int.from_bytes(payload[4:8], 'big'))}" + (f" ({debug[:60]})" if debug else "")
