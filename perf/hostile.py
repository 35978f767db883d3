"""Hostile clients: attacks on the HTTP/2 (gRPC) and HTTP/1.1 fronts of shmserve and of the real
Triton 2.51, one server at a time, and what each did to normal clients and to the server.

    .venv/bin/python perf/hostile.py                       # both servers, every case
    .venv/bin/python perf/hostile.py --quick               # without the cases that wait 40 s
    .venv/bin/python perf/hostile.py --servers shmserve --cases zero_infer,gzip_bomb
    .venv/bin/python perf/hostile.py --list                # the cases, with what each sends

Every attack is our own code, bounded in time and size, against 127.0.0.1 only. Per case and
server it records:
- the answer: what the server did to the attacker (GOAWAY, RST_STREAM, a grpc-status, an HTTP
  status, the connection closed, nothing);
- the probe: a separate process that, from before the attack until its connections are closed,
  sends a normal request every 20 ms (gRPC ModelInfer of identity_fp32 and HTTP GET
  /v2/health/ready in turn, each on a connection opened before the attack); the highest and
  the 99th percentile latency, a request that failed or had no answer in 5 s counting 5000 ms;
- the server's main process's memory (tritonserver; shmserve's front): peak growth (VmHWM
  after a reset through /proc/<pid>/clear_refs, and VmRSS sampled every 50 ms) and retained
  growth (VmRSS 3 s after the attack's connections closed), both against VmRSS before;
- whether the server died (or stopped answering); it is then started again for the next case.

Results go to perf/results/<date>-hostile.json (and .md), the table to stdout.
"""
import argparse
import asyncio
import collections
import json
import logging
import multiprocessing
import os
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

import hpack
from tritonclient.grpc import service_pb2

from servers import (PERF_DIR, REPO_ROOT, SERVER_NAMES, ServerError, ShmServer, TritonServer,
                     add_server_arguments, anchors_env, http_ok, markdown_row, process_tree,
                     rss_kib)

MODEL = "identity_fp32"
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
SERVICE = "/inference.GRPCInferenceService/"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
STALL_MS = 100          # a normal request slower than this during an attack is a stall
PROBE_PERIOD_S = 0.020
PROBE_TIMEOUT_S = 5.0   # a probe request with no answer by then counts 5000 ms
RETAIN_WAIT_S = 3.0     # retained RSS: VmRSS this long after the attack's connections closed
AFTERMATH_S = 1.0       # the probe's window goes on this long after they closed
GROWTH_MIB = 50         # the summary's threshold for peak and retained growth
MIB = 1 << 20

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
ZEROS = bytes(1 << 24)  # the largest frame a server may allow


def h2_error(code: int) -> str:
    return H2_ERRORS[code] if 0 <= code < len(H2_ERRORS) else f"error 0x{code:x}"


def grpc_code(code: int) -> str:
    return f"{code} {GRPC_CODES[code] if 0 <= code < len(GRPC_CODES) else '?'}"


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">IBI", (len(payload) << 8) | ftype, flags, sid) + payload


def settings_frame(settings: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in settings.items()))


def grpc_message(payload: bytes, compressed: bool = False) -> bytes:
    """gRPC's length-prefixed message: a flag byte, a 4-byte big-endian length, the bytes."""
    return struct.pack(">BI", int(compressed), len(payload)) + payload


def infer_request(elements: int = 16, model_name: str = MODEL) -> bytes:
    """A serialized ModelInferRequest of identity_fp32: FP32 [1, elements]."""
    req = service_pb2.ModelInferRequest(model_name=model_name)
    tensor = req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, elements])
    del tensor
    req.raw_input_contents.append(struct.pack(f"<{elements}f", *range(elements)) if elements <= 4096
                                  else bytes(4 * elements))
    return req.SerializeToString()


_BOMB: bytes | None = None


def gzip_bomb() -> bytes:
    """A gzip stream (wbits 31) of 1 GiB of zeros, about 1 MB; made once per run."""
    global _BOMB
    if _BOMB is None:
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        chunk = ZEROS[:1 << 24]
        parts = [z.compress(chunk) for _ in range((1 << 30) // len(chunk))]
        _BOMB = b"".join(parts) + z.flush()
    return _BOMB


# ---------------------------------------------------------------------------------------------
# A raw HTTP/2 client connection

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


# ---------------------------------------------------------------------------------------------
# HTTP/1.1 on a raw connection

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


# ---------------------------------------------------------------------------------------------
# One case's context: ports, deadlines, and everything it opened (closed by the runner)

class Ctx:
    def __init__(self, server, budget_s: float):
        self.grpc_port, self.http_port = server.grpc_port, server.http_port
        self.budget_s = budget_s
        self.t0 = time.monotonic()
        self.h2conns: list[H2Conn] = []
        self.h1conns: list[Http1Conn] = []
        self.closers: list[Callable[[], None]] = []
        self.details: dict = {}

    def deadline(self, seconds: float | None = None) -> float:
        """Monotonic time `seconds` from now, never past the case's budget."""
        end = self.t0 + self.budget_s
        return end if seconds is None else min(time.monotonic() + seconds, end)

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def h2(self, *, open_timeout: float = 5.0, preface: bool = True, **kw) -> H2Conn:
        c = H2Conn(self.grpc_port, self.t0, **kw)
        self.h2conns.append(c)
        await c.open(open_timeout, preface)
        return c

    async def h1(self) -> Http1Conn:
        c = Http1Conn(self.http_port, self.t0)
        self.h1conns.append(c)
        await c.open()
        return c

    def close_all(self) -> None:
        for c in self.h2conns + self.h1conns:
            c.close()
        for close in self.closers:
            try:
                close()
            except OSError:
                pass

    def summary(self) -> str:
        """What the connections saw, for a case stopped before it could say."""
        ends = collections.Counter(c.events() or "open" for c in self.h2conns)
        ends.update(c.describe() or "open" for c in self.h1conns)
        return ", ".join(f"{n}× {what}" if n > 1 else what for what, n in ends.most_common(3))


# ---------------------------------------------------------------------------------------------
# The cases: one function each, returning the answer (a short text); details go to ctx.details.

async def zero_infer(ctx: Ctx) -> str:
    """One ModelInfer whose message is 8 MiB of zero bytes (a field number 0, not a protobuf),
    sent within the server's flow-control windows. A robust server refuses it (INVALID_ARGUMENT,
    or RESOURCE_EXHAUSTED past its message limit) without holding other clients up and without
    keeping the 8 MiB."""
    c = await ctx.h2()
    sid = c.open_stream(INFER)
    message = grpc_message(bytes(8 * MIB))
    sent = await c.send_data(sid, message, end_stream=True, deadline=ctx.deadline(12))
    await c.wait_until(lambda: c.stream(sid).finished or c.dead(), ctx.deadline(12))
    ctx.details["sent_bytes"] = sent
    return c.describe([sid], ctx.now()) + (f"; sent {sent:,} of {len(message):,} bytes" if sent < len(message) else "")


async def gzip_bomb_grpc(ctx: Ctx) -> str:
    """One ModelInfer with grpc-encoding: gzip whose message (compressed flag 1) is a ~1 MB gzip
    stream that inflates to 1 GiB of zeros. A robust server stops inflating at its message size
    limit (RESOURCE_EXHAUSTED) or refuses the encoding, without a 1 GiB allocation."""
    bomb = gzip_bomb()
    c = await ctx.h2()
    sid = c.open_stream(INFER, extra=(("grpc-encoding", "gzip"),))
    sent = await c.send_data(sid, grpc_message(bomb, compressed=True), end_stream=True,
                             deadline=ctx.deadline(15))
    await c.wait_until(lambda: c.stream(sid).finished or c.dead(), ctx.deadline(15))
    ctx.details.update(compressed_bytes=len(bomb), sent_bytes=sent)
    return c.describe([sid], ctx.now())


async def settings_window_flood(ctx: Ctx) -> str:
    """2000 ModelInfer streams opened (HEADERS, no END_STREAM, no DATA) on one connection, then one
    SETTINGS frame as large as the server's MAX_FRAME_SIZE allows holding only
    INITIAL_WINDOW_SIZE entries (2730 at 16384 bytes), alternating 1 and 65535: each entry makes
    a naive server walk all its streams. A robust server caps its streams (REFUSED_STREAM past
    MAX_CONCURRENT_STREAMS) and applies only the last value, or calms the client down, and
    acknowledges quickly."""
    c = await ctx.h2()
    await c.wait_until(lambda: c.settings_acks >= 1 or c.dead(), ctx.deadline(3))
    sids = []
    for i in range(2000):
        sids.append(c.open_stream(INFER))
        if i % 200 == 199 and not await c.drain(ctx.deadline(5)):
            break
    await c.drain(ctx.deadline(5))
    await asyncio.sleep(0.2)
    entries = c.max_frame // 6
    payload = b"".join(struct.pack(">HI", S_INITIAL_WINDOW_SIZE, 1 if i % 2 == 0 else 65535)
                       for i in range(entries))
    acks, sent_at = c.settings_acks, time.monotonic()
    c.write(frame(SETTINGS, 0, 0, payload))
    await c.wait_until(lambda: c.settings_acks > acks or c.dead(), ctx.deadline(10))
    took = time.monotonic() - sent_at
    await c.wait_until(c.dead, ctx.deadline(1))
    ctx.details.update(streams_opened=len(sids), entries=entries, max_frame=c.max_frame,
                       server_max_concurrent_streams=c.server_settings.get(S_MAX_CONCURRENT_STREAMS),
                       ack_s=round(took, 3) if c.settings_acks > acks else None)
    ack = (f"SETTINGS ({entries} entries) ACK after {took:.2f} s" if c.settings_acks > acks
           else f"no SETTINGS ACK in {took:.1f} s")
    return f"{ack}; streams: {c.describe(sids, ctx.now())}"


async def hpack_table_size_flood(ctx: Ctx) -> str:
    """4 requests on one connection, each header block ~1 MB of HPACK dynamic-table-size updates
    to 0 (b"\\x20") followed by a valid ModelInfer header block, sent as HEADERS + CONTINUATIONs
    within the server's frame size, then an identity_fp32 request. A robust server limits a
    header block's size (GOAWAY or a 431-like refusal) or decodes it cheaply, and answers."""
    c = await ctx.h2()
    sids = []
    for _ in range(4):
        block = b"\x20" * 1_000_000 + hpack.Encoder().encode(c.request_headers(INFER))
        s = c.new_stream()
        sids.append(s.sid)
        c.write(c.header_frames(s.sid, block))
        if not await c.drain(ctx.deadline(10)):
            break
        await c.send_data(s.sid, grpc_message(infer_request()), end_stream=True, deadline=ctx.deadline(10))
    await c.wait_until(lambda: c.dead() or all(c.stream(s).finished for s in sids), ctx.deadline(10))
    return c.describe(sids, ctx.now())


async def huge_model_name(ctx: Ctx) -> str:
    """10 ModelInfer requests, one after the other, each naming a model of 4,000,000 characters.
    A robust server answers NOT_FOUND (or INVALID_ARGUMENT) with a short message, not one that
    echoes 4 MB into the trailers."""
    message = grpc_message(infer_request(model_name="m" * 4_000_000))
    outcomes, lengths = [], []
    c = await ctx.h2()
    for _ in range(10):
        if c.dead():
            c = await ctx.h2()
        s = await c.unary(INFER, message, ctx.deadline(10))
        text = c.outcome(s.sid, 10)
        length = len(urllib.parse.unquote(s.header("grpc-message") or ""))
        lengths.append(length)
        outcomes.append(text + (f" (grpc-message {length:,} chars)" if s.header("grpc-status") else ""))
    ctx.details["grpc_message_lengths"] = lengths
    counts = collections.Counter(outcomes)
    events = "; ".join(filter(None, (h.events() for h in ctx.h2conns)))
    return ", ".join(f"{n}× {what}" for what, n in counts.most_common(3)) + (f"; {events}" if events else "")


async def ping_flood_no_read(ctx: Ctx) -> str:
    """2,000,000 PING frames on one connection whose receive buffer is small (SO_RCVBUF 4096) and
    which never reads: the server's PING ACKs pile up. Sending stops when the socket stays
    unwritable for 5 s. A robust server stops reading from (or closes) a client that does not
    read its answers, with bounded memory, and may answer GOAWAY ENHANCE_YOUR_CALM."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    ctx.closers.append(sock.close)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", ctx.grpc_port)), 5)
    await loop.sock_sendall(sock, PREFACE + settings_frame({}))
    await asyncio.sleep(0.1)
    await loop.sock_sendall(sock, frame(SETTINGS, ACK, 0))   # the server's SETTINGS, unread, acknowledged
    ping = frame(PING, 0, 0, b"hostile!")
    batch = memoryview(ping * 10_000)
    total, sent, how = 2_000_000 * len(ping), 0, "all sent"
    deadline = ctx.deadline(20)
    while sent < total:
        if sent % (len(batch) * 20) < len(batch):
            await asyncio.sleep(0)   # lets the runner stop it
        if time.monotonic() > deadline:
            how = "time budget ran out"
            break
        off = sent % len(batch)
        try:
            sent += sock.send(batch[off:off + min(len(batch) - off, total - sent)])
        except BlockingIOError:
            if not await _writable(loop, sock, 5.0):
                how = "the send blocked for 5 s"
                break
        except OSError as e:
            how = f"then the server {'reset' if isinstance(e, ConnectionResetError) else 'closed'} the connection"
            break
    took = ctx.now()
    # What came back, read for up to 2 s: PING ACKs, and a GOAWAY if there was one.
    acks, goaway, buf, closed = 0, None, bytearray(), False
    read_until = time.monotonic() + 2
    while time.monotonic() < read_until:
        try:
            data = await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), read_until - time.monotonic())
        except (asyncio.TimeoutError, OSError):
            break
        if not data:
            closed = True
            break
        buf += data
        while len(buf) >= 9:
            length = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + length:
                break
            if buf[3] == PING and buf[4] & ACK:
                acks += 1
            elif buf[3] == GOAWAY and goaway is None:
                goaway = h2_error(int.from_bytes(buf[13:17], "big"))
            del buf[:9 + length]
    pings = sent // len(ping)
    ctx.details.update(pings_sent=pings, send_s=round(took, 2), acks_read_in_2s=acks)
    return (f"{pings:,} PINGs sent in {took:.1f} s ({how})"
            + (f"; GOAWAY {goaway}" if goaway else "") + f"; then read {acks:,} PING ACKs in 2 s"
            + ("; connection closed" if closed else ""))


async def _writable(loop, sock: socket.socket, timeout: float) -> bool:
    fut = loop.create_future()
    loop.add_writer(sock.fileno(), lambda: fut.done() or fut.set_result(None))
    try:
        await asyncio.wait_for(fut, timeout)
        return True
    except asyncio.TimeoutError:
        return False
    finally:
        loop.remove_writer(sock.fileno())


async def unfinished_header_blocks(ctx: Ctx) -> str:
    """300 connections, each sending a HEADERS frame without END_HEADERS and CONTINUATION frames
    (each within the server's frame size) adding up to ~1 MB, never ending the block; held 5 s.
    A robust server caps a header block (GOAWAY, or closing) instead of buffering 300 MB."""
    filler = hpack.Encoder().encode([(":method", "POST"), (":path", INFER),
                                     ("x-filler", "a" * 1_000_000, True)], huffman=False)

    async def one() -> tuple[H2Conn | None, int, str]:
        try:
            c = await ctx.h2()
        except (OSError, asyncio.TimeoutError) as e:
            return None, 0, f"did not connect ({type(e).__name__})"
        s = c.new_stream()
        frames = c.header_frames(s.sid, filler, end_headers=False)
        sent = 0
        for i in range(0, len(frames), 1 << 16):
            c.write(frames[i:i + (1 << 16)])
            if not await c.drain(ctx.deadline(20)):
                break
            sent = min(i + (1 << 16), len(frames))
        return c, sent, ""

    results = await asyncio.gather(*(one() for _ in range(300)))
    await asyncio.sleep(max(0.0, min(5.0, ctx.t0 + ctx.budget_s - time.monotonic())))
    whats = collections.Counter()
    for c, sent, failed in results:
        if c is None:
            whats[failed] += 1
        elif c.events():
            whats[c.events().split(" at ")[0]] += 1
        else:
            whats["open after 5 s" + ("" if sent >= 1_000_000 else ", sending blocked")] += 1
    total = sum(sent for _, sent, _ in results)
    ctx.details.update(bytes_sent=total)
    return ", ".join(f"{n}× {what}" for what, n in whats.most_common(3)) + f"; {total / MIB:.0f} MiB sent"


async def big_message_streams(ctx: Ctx) -> str:
    """8 ModelInfer streams on one connection, each message's prefix announcing 2 GiB - 1 bytes of
    a valid beginning (model_name, then a raw_input_contents field as long as the rest), then
    zeros as fast as the server's windows allow, for 10 s: a message no parse error stops early.
    A robust server refuses a message past its limit from the prefix (RESOURCE_EXHAUSTED)
    instead of buffering it."""
    c = await ctx.h2()
    sids = [c.open_stream(INFER) for _ in range(8)]
    size = 2**31 - 1
    head = b"\x0a" + bytes([len(MODEL)]) + MODEL.encode()   # model_name
    head += b"\x3a" + _varint(size - len(head) - 6)           # raw_input_contents (5-byte varint)
    start = grpc_message(b"")[:1] + struct.pack(">I", size) + head
    deadline = ctx.deadline(10)

    async def feed(sid: int) -> int:
        sent = await c.send_data(sid, start, end_stream=False, deadline=deadline)
        return sent + await c.send_data(sid, size=size - len(head), end_stream=False, deadline=deadline)

    sent = await asyncio.gather(*(feed(sid) for sid in sids))
    await c.wait_until(lambda: c.dead() or all(c.stream(s).finished for s in sids), ctx.deadline(1))
    ctx.details["bytes_sent"] = sum(sent)
    return c.describe(sids, ctx.now()) + f"; {sum(sent) / MIB:,.0f} MiB sent in {min(ctx.now(), 10):.0f} s"


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


async def stream_lockout(ctx: Ctx) -> str:
    """Client A opens 1100 ModelStreamInfer calls (HEADERS only), on as many connections as the
    server's MAX_CONCURRENT_STREAMS needs; then client B, on a connection of its own, opens one
    ModelStreamInfer and sends one identity_fp32 request. A robust server serves B within its
    usual time (per-connection limits, not one global pool that A used up)."""
    opened, conns = 0, 0
    while opened < 1100 and ctx.now() < 10:
        a = await ctx.h2()
        conns += 1
        room = min(a.server_settings.get(S_MAX_CONCURRENT_STREAMS, 1100), 1100 - opened)
        if room <= 0:
            break
        for _ in range(room):
            a.open_stream(STREAM_INFER)
        opened += room
        await a.drain(ctx.deadline(5))
    await asyncio.sleep(0.5)
    b = await ctx.h2()
    sid = b.open_stream(STREAM_INFER)
    s = b.stream(sid)
    s.keep_body = True
    started = time.monotonic()
    await b.send_data(sid, grpc_message(infer_request()), end_stream=False, deadline=ctx.deadline(5))
    await b.wait_until(lambda: b.dead() or s.finished or _stream_message(s) is not None, started + 5)
    took = time.monotonic() - started
    refused = sum(1 for a in ctx.h2conns[:-1] for st in a.streams.values() if st.rst is not None)
    ctx.details.update(a_streams=opened, a_connections=conns, a_streams_reset=refused,
                       b_ms=round(took * 1000, 1))
    answer = _stream_message(s)
    if answer is not None:
        resp = service_pb2.ModelStreamInferResponse.FromString(answer)
        verdict = (f"B: error response after {took * 1000:.0f} ms: {resp.error_message[:60]}" if resp.error_message
                   else f"B answered in {took * 1000:.0f} ms")
    else:
        verdict = f"B: {b.describe([sid], 5)}"
    a_events = collections.Counter(a.describe(list(a.streams), None) for a in ctx.h2conns[:-1])
    return f"{verdict}; A ({opened} streams on {conns} conn): " + ", ".join(
        (f"{n}× {w}" if n > 1 else w) for w, n in a_events.most_common(2))


def _stream_message(s: Stream) -> bytes | None:
    """The first complete gRPC message of a stream's body, if it came."""
    if len(s.body) >= 5:
        length = int.from_bytes(s.body[1:5], "big")
        if len(s.body) >= 5 + length:
            return bytes(s.body[5:5 + length])
    return None


async def idle_one_byte(ctx: Ctx) -> str:
    """Connects to the gRPC port, sends one byte of the client preface, then waits up to 40 s.
    A robust server closes a connection that does not finish its preface after a timeout."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", ctx.grpc_port), 5)
    ctx.closers.append(lambda: writer.transport.abort())
    writer.write(PREFACE[:1])
    received = 0
    try:
        async with asyncio.timeout(40):
            while data := await reader.read(1 << 16):
                received += len(data)
    except TimeoutError:
        return "held 40 s" + (f" ({received} bytes received)" if received else "")
    except (ConnectionError, OSError) as e:
        return f"connection reset after {ctx.now():.1f} s ({type(e).__name__})"
    return f"connection closed after {ctx.now():.1f} s" + (f" ({received} bytes received)" if received else "")


async def idle_after_settings(ctx: Ctx) -> str:
    """The full client preface and an empty SETTINGS, then nothing (not even the ACK of the
    server's SETTINGS nor of its PINGs), up to 40 s. A robust server closes it after an idle
    or SETTINGS timeout (GOAWAY SETTINGS_TIMEOUT, or a keepalive's GOAWAY)."""
    c = await ctx.h2(ack_settings=False, ack_pings=False)
    await c.wait_until(c.dead, ctx.deadline(40))
    ctx.details.update(pings_received=c.pings)
    if not c.dead():
        return "held 40 s" + (f" ({c.pings} PINGs received)" if c.pings else "")
    return c.events() + (f" ({c.pings} PINGs received)" if c.pings else "")


async def http_deep_pipelining(ctx: Ctx) -> str:
    """200 GET /v2/health/ready requests pipelined in one write on one keep-alive connection. A
    robust server answers all 200 in order (or stops reading until it has answered, never
    dropping any)."""
    h = await ctx.h1()
    h.write(http_request("GET", "/v2/health/ready", ctx.http_port) * 200)
    await h.wait(200, ctx.deadline(10))
    runs: list[list] = []
    for _, status, _, _ in h.responses:
        if runs and runs[-1][0] == status:
            runs[-1][1] += 1
        else:
            runs.append([status, 1])
    ctx.details["status_runs"] = runs
    text = ", then ".join(f"{n}× {status}" for status, n in runs) or "no answer"
    if len(h.responses) < 200:
        text += f"; {200 - len(h.responses)} unanswered" + (f", connection {h.close_how} at {h.closed_at:.1f} s"
                                                            if h.closed_at is not None else "")
    return text


async def http_stalled_body(ctx: Ctx) -> str:
    """A POST to /v2/models/identity_fp32/infer announcing Content-Length 1000 with only 10
    bytes of body, then silence, up to 40 s. A robust server times the body out (408 or a
    close) without holding other clients up."""
    h = await ctx.h1()
    h.write(http_request("POST", f"/v2/models/{MODEL}/infer", ctx.http_port, b"",
                         (("Content-Type", "application/json"),)).replace(b"Content-Length: 0", b"Content-Length: 1000")
            + b'{"inputs":')
    await h.wait(1, ctx.deadline(40))
    return h.describe() or "held 40 s"


async def bad_input(ctx: Ctx) -> str:
    """A barrage of bad arguments: system shared memory registered with keys "/../../etc/passwd",
    "/no_such_key_xyz" and "" over gRPC and HTTP; unparseable protobuf (b"\\xff\\xff\\xff") to
    SystemSharedMemoryRegister and RepositoryModelLoad; a model load of "../../etc" over HTTP
    (percent-encoded) and gRPC. A robust server answers each with a client error (4xx,
    INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE), not INTERNAL, UNKNOWN or 5xx."""
    calls: list[tuple[str, str]] = []
    c = await ctx.h2()

    async def grpc(label: str, method: str, message: bytes) -> None:
        nonlocal c
        if c.dead():
            c = await ctx.h2()
        s = await c.unary(SERVICE + method, grpc_message(message), ctx.deadline(5))
        status = s.header("grpc-status")
        calls.append((label, f"grpc {grpc_code(int(status))}" if status is not None else c.outcome(s.sid, 5)))

    async def http(label: str, path: str, body: bytes) -> None:
        h = await ctx.h1()
        h.write(http_request("POST", path, ctx.http_port, body, (("Content-Type", "application/json"),)))
        await h.wait(1, ctx.deadline(5))
        calls.append((label, f"HTTP {h.responses[0][1]}" if h.responses else h.describe() or "no answer in 5 s"))
        h.close()

    for key in ("/../../etc/passwd", "/no_such_key_xyz", ""):
        req = service_pb2.SystemSharedMemoryRegisterRequest(name="r1", key=key, offset=0, byte_size=16)
        await grpc(f"grpc shm register key {key!r}", "SystemSharedMemoryRegister", req.SerializeToString())
        await grpc("grpc shm unregister r1", "SystemSharedMemoryUnregister",
                   service_pb2.SystemSharedMemoryUnregisterRequest(name="r1").SerializeToString())
        calls.pop()   # the unregister is only cleanup
    for key in ("/../../etc/passwd", "/no_such_key_xyz", ""):
        await http(f"http shm register key {key!r}", "/v2/systemsharedmemory/region/r1/register",
                   json.dumps({"key": key, "offset": 0, "byte_size": 16}).encode())
        await http("cleanup", "/v2/systemsharedmemory/region/r1/unregister", b"")
        calls.pop()
    await grpc("grpc shm register b'\\xff\\xff\\xff'", "SystemSharedMemoryRegister", b"\xff\xff\xff")
    await grpc("grpc model load b'\\xff\\xff\\xff'", "RepositoryModelLoad", b"\xff\xff\xff")
    await http("http load ..%2F..%2Fetc", "/v2/repository/models/..%2F..%2Fetc/load", b"")
    await grpc("grpc model load '../../etc'", "RepositoryModelLoad",
               service_pb2.RepositoryModelLoadRequest(model_name="../../etc").SerializeToString())
    server_errors = [label for label, code in calls
                     if code.split()[-1] in ("UNKNOWN", "INTERNAL") or code.startswith("HTTP 5")
                     or not code.startswith(("grpc", "HTTP"))]
    ctx.details.update(calls=dict(calls), server_errors=server_errors)
    codes = collections.Counter(code for _, code in calls)
    return (f"{len(server_errors)} of {len(calls)} server errors; "
            + ", ".join(f"{n}× {code}" for code, n in codes.most_common()))


async def rapid_reset(ctx: Ctx) -> str:
    """10,000 streams in one burst, each a complete identity_fp32 ModelInfer (HEADERS, DATA with
    END_STREAM) immediately followed by RST_STREAM(CANCEL) (CVE-2023-44487). A robust server
    keeps the work bounded and, past a rate, answers GOAWAY ENHANCE_YOUR_CALM."""
    c = await ctx.h2()
    message = grpc_message(infer_request())
    opened, deadline, starved = 0, ctx.deadline(12), False
    while opened < 10_000 and not c.dead() and time.monotonic() < deadline:
        if c.conn_window < len(message) * 100:
            await c.wait_until(lambda: c.dead() or c.conn_window >= len(message) * 100, deadline)
            if c.conn_window < len(message) * 100:
                starved = not c.dead()
                break
        out = []
        for _ in range(100):
            s = c.new_stream()
            out.append(c.header_frames(s.sid, c.encoder.encode(c.request_headers(INFER))))
            out.append(frame(DATA, END_STREAM, s.sid, message))
            out.append(frame(RST_STREAM, 0, s.sid, struct.pack(">I", CANCEL)))
            s.reset_by_us = True
            c.conn_window -= len(message)
        c.write(b"".join(out))
        opened += 100
        if not await c.drain(deadline):
            break
    took = ctx.now()
    await c.wait_until(c.dead, ctx.deadline(1.5))
    answered = sum(1 for s in c.streams.values() if s.blocks)
    ctx.details.update(streams=opened, burst_s=round(took, 2), answered_after_reset=answered)
    return (f"{opened:,} streams opened and reset in {took:.1f} s"
            + ("; stopped: the server did not open the connection window again" if starved else "")
            + (f"; {c.events()}" if c.events() else "")
            + (f"; {answered} answered anyway" if answered else ""))


async def _flood(ctx: Ctx, c, frames: bytes, per_batch: int, batches: int) -> int:
    """`frames` (`per_batch` frames) written `batches` times, each once the last has drained;
    how many frames went."""
    sent = 0
    for _ in range(batches):
        c.write(frames)
        if not await c.drain(ctx.deadline(10)):
            break
        sent += per_batch
    return sent


async def continuation_flood(ctx: Ctx) -> str:
    """One HEADERS frame without END_HEADERS (a ModelInfer's headers), then 100,000 empty
    CONTINUATION frames, never ending the block. A robust server limits the frames of a header
    block and answers GOAWAY (ENHANCE_YOUR_CALM or PROTOCOL_ERROR) early."""
    c = await ctx.h2()
    s = c.new_stream()
    c.write(c.header_frames(s.sid, c.encoder.encode(c.request_headers(INFER)), end_headers=False))
    sent = await _flood(ctx, c, frame(CONTINUATION, 0, s.sid) * 10_000, 10_000, 10)
    took = ctx.now()
    await c.wait_until(c.dead, ctx.deadline(2))
    ctx.details.update(frames_sent=sent, send_s=round(took, 2))
    return (c.events() or "no answer") + f"; {sent:,} CONTINUATIONs sent in {took:.2f} s"


async def empty_data_flood(ctx: Ctx) -> str:
    """One ModelInfer stream opened (HEADERS), then 200,000 empty DATA frames on it (no
    END_STREAM). A robust server treats floods of empty frames as abuse (GOAWAY
    ENHANCE_YOUR_CALM) or takes them at no cost, answering others meanwhile."""
    c = await ctx.h2()
    sid = c.open_stream(INFER)
    sent = await _flood(ctx, c, frame(DATA, 0, sid) * 10_000, 10_000, 20)
    took = ctx.now()
    await c.wait_until(lambda: c.dead() or c.stream(sid).finished, ctx.deadline(2))
    ctx.details.update(frames_sent=sent, send_s=round(took, 2))
    return c.describe([sid], None) + f"; {sent:,} empty DATA frames sent in {took:.2f} s"


async def settings_flood(ctx: Ctx) -> str:
    """100,000 empty SETTINGS frames, reading the ACKs. A robust server acknowledges them at low
    cost, or limits unacknowledged SETTINGS with GOAWAY ENHANCE_YOUR_CALM."""
    c = await ctx.h2()
    await c.wait_until(lambda: c.settings_acks >= 1 or c.dead(), ctx.deadline(3))
    before = c.settings_acks
    sent = await _flood(ctx, c, frame(SETTINGS, 0, 0) * 5_000, 5_000, 20)
    await c.wait_until(lambda: c.dead() or c.settings_acks - before >= sent, ctx.deadline(5))
    acks = c.settings_acks - before
    ctx.details.update(sent=sent, acks=acks)
    return f"{acks:,} ACKs for {sent:,} SETTINGS in {ctx.now():.1f} s" + (f"; {c.events()}" if c.events() else "")


async def zero_window(ctx: Ctx) -> str:
    """A client whose SETTINGS_INITIAL_WINDOW_SIZE is 0 and which never sends WINDOW_UPDATE:
    100 identity_fp32 ModelInfer requests of 1 MiB inputs (sent within the server's windows),
    held 5 s. The server can send headers but no DATA. A robust server bounds what it holds for
    a client that does not read (it stops reading its requests, or times them out)."""
    c = await ctx.h2(settings={S_INITIAL_WINDOW_SIZE: 0}, window_updates=False)
    message = grpc_message(infer_request(elements=MIB // 4))
    sids, deadline = [], ctx.deadline(10)
    for _ in range(100):
        if c.dead() or time.monotonic() > deadline:
            break
        sid = c.open_stream(INFER)
        sids.append(sid)
        if await c.send_data(sid, message, end_stream=True, deadline=deadline) < len(message):
            break
    await asyncio.sleep(max(0.0, min(5.0, ctx.t0 + ctx.budget_s - time.monotonic())))
    heads = sum(1 for sid in sids if c.stream(sid).blocks)
    ctx.details.update(requests_sent=len(sids), response_headers=heads)
    return (f"{len(sids)} requests of 1 MiB sent, {heads} response headers" + (f"; {c.events()}" if c.events() else "")
            + (f"; {c.describe(sids, None)}" if not heads else ""))


async def many_idle_connections(ctx: Ctx) -> str:
    """5000 TCP connections to the gRPC port (the benchmark's RLIMIT_NOFILE raised to its hard
    limit), each sending the preface and SETTINGS, then idle 5 s. A robust server keeps serving
    others (it may cap connections, or close idle ones)."""
    sem = asyncio.Semaphore(200)
    closed_at: list[float] = []
    goaways = collections.Counter()
    failures = collections.Counter()

    async def one() -> bool:
        async with sem:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", ctx.grpc_port), 5)
            except (OSError, asyncio.TimeoutError) as e:
                failures[type(e).__name__] += 1
                return False
        # The closer holds the writer: a StreamWriter that is collected closes its connection.
        ctx.closers.append(lambda: writer.transport.abort())
        writer.write(PREFACE + settings_frame({}))

        async def watch():
            """Reads what the server sends until it closes: its SETTINGS, a GOAWAY perhaps."""
            got = bytearray()
            try:
                while data := await reader.read(1 << 16):
                    got += data[:4096]
            except (ConnectionError, OSError):
                pass
            closed_at.append(ctx.now())
            for ftype, _, _, payload in parse_frames(got):
                if ftype == GOAWAY and len(payload) >= 8:
                    goaways[goaway_text(payload)] += 1
        ctx.closers.append(asyncio.ensure_future(watch()).cancel)
        return True

    connected = sum(await asyncio.gather(*(one() for _ in range(5000))))
    connect_s = ctx.now()
    await asyncio.sleep(max(0.0, min(5.0, ctx.t0 + ctx.budget_s - time.monotonic())))
    closed = len(closed_at)
    ctx.details.update(connected=connected, connect_s=round(connect_s, 1), closed_by_server=closed,
                       goaways=dict(goaways), failures=dict(failures))
    text = f"{connected} of 5000 connected in {connect_s:.1f} s"
    if failures:
        text += " (failed: " + ", ".join(f"{n}× {k}" for k, n in failures.items()) + ")"
    if not closed:
        return text + "; all held 5 s"
    return (text + f"; {closed} closed by the server, first at {min(closed_at):.1f} s, last at "
            f"{max(closed_at):.1f} s" + "".join(f"; {n}× {g}" for g, n in goaways.most_common(2)))


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


async def http_slowloris(ctx: Ctx) -> str:
    """500 HTTP connections, each sending the head of a GET one byte a second for 10 s, never
    finishing it. A robust server times slow heads out or caps them, and keeps serving others."""
    head = b"GET /v2/health/ready HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: abcdefghijklmnopqrstuvwxyz"
    conns, failed = [], 0
    for _ in range(500):
        try:
            conns.append(await ctx.h1())
        except (OSError, asyncio.TimeoutError):
            failed += 1
    for i in range(10):
        for h in conns:
            h.write(head[i:i + 1])
        await asyncio.sleep(1.0)
    closed = [h.closed_at for h in conns if h.closed_at is not None]
    answers = collections.Counter(r[1] for h in conns for r in h.responses)
    ctx.details.update(connected=len(conns), closed_by_server=len(closed), answers=dict(answers))
    text = f"{len(conns) - len(closed)} of {len(conns)} still open after 10 s"
    if closed:
        text += f"; {len(closed)} closed by the server, first at {min(closed):.1f} s"
    if answers:
        text += "; answers " + ", ".join(f"{n}× HTTP {s}" for s, n in answers.items())
    return text + (f"; {failed} did not connect" if failed else "")


async def http_gzip_bomb(ctx: Ctx) -> str:
    """An HTTP infer whose body, Content-Encoding: gzip, is a ~1 MB gzip stream that inflates to
    1 GiB of zeros. A robust server stops inflating at its input size limit (400/413) without a
    1 GiB allocation."""
    bomb = gzip_bomb()
    h = await ctx.h1()
    h.write(http_request("POST", f"/v2/models/{MODEL}/infer", ctx.http_port, bomb,
                         (("Content-Type", "application/json"), ("Content-Encoding", "gzip"))))
    await h.wait(1, ctx.deadline(15))
    return h.describe() or f"no answer in {ctx.now():.0f} s"


@dataclass
class Case:
    name: str
    run: Callable[[Ctx], Awaitable[str]]
    budget_s: float            # the attack's time; the runner stops it 10 s past this
    slow: bool = False         # waits 40 s: skipped with --quick
    raise_nofile: bool = False


CASES = [
    Case("zero_infer", zero_infer, 15),
    Case("gzip_bomb", gzip_bomb_grpc, 20),
    Case("settings_window_flood", settings_window_flood, 20),
    Case("hpack_table_size_flood", hpack_table_size_flood, 15),
    Case("huge_model_name", huge_model_name, 40),
    Case("ping_flood_no_read", ping_flood_no_read, 25),
    Case("unfinished_header_blocks", unfinished_header_blocks, 30),
    Case("big_message_streams", big_message_streams, 15),
    Case("stream_lockout", stream_lockout, 20),
    Case("idle_one_byte", idle_one_byte, 45, slow=True),
    Case("idle_after_settings", idle_after_settings, 45, slow=True),
    Case("http_deep_pipelining", http_deep_pipelining, 15),
    Case("http_stalled_body", http_stalled_body, 45, slow=True),
    Case("bad_input", bad_input, 40),
    Case("rapid_reset", rapid_reset, 20),
    Case("continuation_flood", continuation_flood, 15),
    Case("empty_data_flood", empty_data_flood, 15),
    Case("settings_flood", settings_flood, 20),
    Case("zero_window", zero_window, 20),
    Case("many_idle_connections", many_idle_connections, 30, raise_nofile=True),
    Case("http_slowloris", http_slowloris, 20),
    Case("http_gzip_bomb", http_gzip_bomb, 20),
]


# ---------------------------------------------------------------------------------------------
# The probe: a separate process, a normal request every 20 ms

def probe_main(pipe, grpc_port: int, http_port: int, request: bytes) -> None:
    """Runs in its own process: opens a gRPC channel and a keep-alive HTTP connection, checks
    both answer, says "ready", then alternates a ModelInfer and a GET /v2/health/ready every
    20 ms until told to stop, and sends back (start, end, kind, ok, error) per request."""
    import http.client
    import grpc
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}",
                                    options=[("grpc.enable_http_proxy", 0), ("grpc.enable_retries", 0)])
    infer = channel.unary_unary(INFER)
    conn: list = [None]

    def do_http() -> None:
        if conn[0] is None:
            conn[0] = http.client.HTTPConnection("127.0.0.1", http_port, timeout=PROBE_TIMEOUT_S)
            conn[0].connect()
        conn[0].request("GET", "/v2/health/ready")
        r = conn[0].getresponse()
        r.read()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}")

    def do_grpc() -> None:
        infer(request, timeout=PROBE_TIMEOUT_S)

    def attempt(kind: str, fn) -> tuple[bool, str | None]:
        try:
            fn()
            return True, None
        except Exception as e:   # noqa: BLE001 - any failure is a failed request
            if kind == "http" and conn[0] is not None:
                conn[0].close()
                conn[0] = None
            code = getattr(e, "code", None)
            text = code().name if callable(code) else f"{type(e).__name__}: {e}"
            return False, text[:120]

    warm_error = None
    for kind, fn in (("grpc", do_grpc), ("http", do_http)):
        for _ in range(50):
            ok, warm_error = attempt(kind, fn)
            if ok:
                break
            time.sleep(0.2)
        if warm_error:
            break
    pipe.send(("ready", warm_error))
    samples = []
    kinds = [("grpc", do_grpc), ("http", do_http)]
    i, next_at = 0, time.monotonic()
    while not pipe.poll(max(0.0, next_at - time.monotonic())):
        now = time.monotonic()
        next_at = max(next_at + PROBE_PERIOD_S, now)
        kind, fn = kinds[i % 2]
        i += 1
        ok, error = attempt(kind, fn)
        samples.append((now, time.monotonic(), kind, ok, error))
    pipe.send(samples)
    channel.close()


class Probe:
    def __init__(self, server):
        ctx = multiprocessing.get_context("spawn")
        self.pipe, child = ctx.Pipe()
        self.proc = ctx.Process(target=probe_main, args=(child, server.grpc_port, server.http_port,
                                                         infer_request()), daemon=True)
        self.proc.start()
        child.close()
        self.samples: list | None = None

    def wait_ready(self, timeout: float = 30) -> str | None:
        """None when both requests answered, else the error."""
        if not self.pipe.poll(timeout):
            return "the probe was not ready in 30 s"
        return self.pipe.recv()[1]

    def stop(self) -> None:
        try:
            self.pipe.send("stop")
        except OSError:
            pass

    def collect(self, timeout: float = 15) -> list:
        if self.samples is None:
            self.samples = self.pipe.recv() if self.pipe.poll(timeout) else []
        self.terminate()
        return self.samples

    def terminate(self) -> None:
        if self.proc.is_alive():
            self.proc.terminate()
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def probe_figures(samples: list, t0: float, t1: float) -> dict:
    """Latencies of the probe's requests that overlapped [t0, t1]: failures and timeouts count
    5000 ms."""
    lat, failures, first_error, slowest = [], 0, None, (0.0, None, None)
    for start, end, kind, ok, error in samples:
        if end < t0 or start > t1:
            continue
        if ok:
            lat.append(min((end - start) * 1000, PROBE_TIMEOUT_S * 1000))
        else:
            lat.append(PROBE_TIMEOUT_S * 1000)
            failures += 1
            first_error = first_error or f"{kind}: {error}"
        if lat[-1] > slowest[0]:
            slowest = (lat[-1], kind, round(start - t0, 2))
    lat.sort()
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None
    return dict(n=len(lat), max_ms=round(lat[-1], 1) if lat else None, p99_ms=round(p99, 1) if lat else None,
                over_stall=sum(1 for x in lat if x > STALL_MS), failures=failures, first_error=first_error,
                slowest_kind=slowest[1], slowest_at_s=slowest[2])


# ---------------------------------------------------------------------------------------------
# Memory of the server's main process

def status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def reset_hwm(pid: int) -> None:
    """Sets VmHWM to the current VmRSS (clear_refs 5, Linux 4.0+)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


class RssWatch(threading.Thread):
    """Samples VmRSS every 50 ms; calls on_limit once when it passes limit_kib."""

    def __init__(self, pid: int, limit_kib: int, on_limit: Callable[[], None]):
        super().__init__(daemon=True)
        self.pid, self.limit_kib, self.on_limit = pid, limit_kib, on_limit
        self.max_kib = 0
        self.tripped_at: float | None = None
        self.t0 = time.monotonic()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                rss = rss_kib(self.pid)
            except (OSError, StopIteration):
                return
            self.max_kib = max(self.max_kib, rss)
            if rss > self.limit_kib and self.tripped_at is None:
                self.tripped_at = time.monotonic() - self.t0
                self.on_limit()
            self.done.wait(0.05)

    def stop(self) -> None:
        self.done.set()
        self.join()


# ---------------------------------------------------------------------------------------------
# Servers

def alive(server) -> bool:
    if server.pid is None:
        return False
    if isinstance(server, ShmServer):
        return server.proc is not None and server.proc.poll() is None
    try:
        with open(f"/proc/{server.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def healthy(server, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(server):
            return False
        if http_ok(f"http://127.0.0.1:{server.http_port}/v2/health/ready"):
            return True
        time.sleep(0.5)
    return False


def _starttime(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


class Managed:
    """A server we start, restart and stop, with a log per start, and whatever it started
    (Triton's python-backend stubs) killed after it if still alive."""

    def __init__(self, server, log_stem: Path):
        self.server, self.log_stem = server, log_stem
        self.starts = 0
        self.pids: set[int] = set()   # of every start
        self.tree: dict[int, str | None] = {}
        self.leftovers: list[int] = []

    def start(self) -> None:
        self.starts += 1
        self.server.log_path = Path(f"{self.log_stem}-{self.server.name}-{self.starts}.log")
        self.server.start()
        self.pids.add(self.server.pid)
        self.server.wait_model_ready(MODEL)
        self.tree = {pid: _starttime(pid) for pid in process_tree(self.server.pid)}

    def stop(self) -> None:
        self.leftovers += self.server.stop()
        # Triton's stubs end on their own soon after it: given 10 s, then killed and reported.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(
                started is not None and _starttime(pid) == started for pid, started in self.tree.items()):
            time.sleep(0.2)
        for pid, started in self.tree.items():
            if started is not None and _starttime(pid) == started:
                try:
                    os.kill(pid, signal.SIGKILL)
                    self.leftovers.append(pid)
                except ProcessLookupError:
                    pass
        self.tree = {}

    def restart(self) -> None:
        self.stop()
        self.start()


# ---------------------------------------------------------------------------------------------
# Running a case

async def run_case(case: Case, managed: Managed, args) -> dict:
    server = managed.server
    record: dict = dict(case=case.name, server=server.name)
    probe = Probe(server)
    try:
        error = probe.wait_ready()
        if error:
            record["probe_not_ready"] = error
            probe.terminate()
            managed.restart()
            probe = Probe(server)
            if probe.wait_ready():
                raise ServerError(f"{server.name} does not answer the probe before {case.name}: {error}")
        await asyncio.sleep(0.5)   # the probe's baseline
        pid = server.pid
        rss_before = rss_kib(pid)
        reset_hwm(pid)
        loop = asyncio.get_running_loop()
        ctx = Ctx(server, case.budget_s)
        task = asyncio.ensure_future(case.run(ctx))
        watch = RssWatch(pid, args.rss_limit_mib * 1024, lambda: loop.call_soon_threadsafe(task.cancel))
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
        if case.raise_nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile[1], nofile[1]))
        watch.start()
        t_start = time.monotonic()
        try:
            done, _ = await asyncio.wait({task}, timeout=case.budget_s + 10)
            if task not in done:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                answer = f"stopped by the benchmark after {case.budget_s + 10:.0f} s; {ctx.summary()}"
            elif task.cancelled():
                answer = (f"stopped by the benchmark: server RSS passed {args.rss_limit_mib} MiB at "
                          f"{watch.tripped_at:.1f} s; {ctx.summary()}")
            elif task.exception() is not None:
                e = task.exception()
                if isinstance(e, (OSError, asyncio.TimeoutError)):
                    answer = f"attack failed: {type(e).__name__} {e}; {ctx.summary()}"
                else:   # a bug of the benchmark's: said, and the run goes on
                    traceback.print_exception(e)
                    record["benchmark_error"] = repr(e)
                    answer = f"BENCHMARK ERROR {e!r}"
            else:
                answer = task.result()
        finally:
            ctx.close_all()
            await asyncio.sleep(0)
            t_end = time.monotonic()
            if case.raise_nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, nofile)
        # The aftermath: the probe and the RSS sampler go on for AFTERMATH_S, as a server may
        # still be busy with what the attack left it (a message to inflate, answers to drop).
        await asyncio.sleep(AFTERMATH_S)
        watch.stop()
        probe.stop()
        hwm = peak = None
        try:
            hwm = status_kib(pid, "VmHWM")
            peak = max(hwm, watch.max_kib)
        except (OSError, StopIteration):
            pass
        await asyncio.sleep(max(0.0, t_end + RETAIN_WAIT_S - time.monotonic()))
        try:
            rss_after = rss_kib(pid)
        except (OSError, StopIteration):
            rss_after = None
        samples = probe.collect()
    finally:
        probe.terminate()
    died = not alive(server)
    hung = not died and not healthy(server)
    record.update(
        answer=answer, attack_s=round(t_end - t_start, 1),
        probe=probe_figures(samples, t_start, t_end + AFTERMATH_S),
        probe_baseline=probe_figures(samples, t_start - 0.5, t_start - 1e-6),
        rss_before_mib=round(rss_before / 1024, 1),
        peak_growth_mib=round((peak - rss_before) / 1024, 1) if peak is not None else None,
        retained_mib=round((rss_after - rss_before) / 1024, 1) if rss_after is not None else None,
        vm_hwm_mib=round(hwm / 1024, 1) if hwm is not None else None,
        rss_limit_hit_s=round(watch.tripped_at, 1) if watch.tripped_at is not None else None,
        died=died, hung=hung, details=ctx.details)
    if died or hung or (record["retained_mib"] or 0) > 1024:
        record["restarted"] = "died" if died else "hung" if hung else "retained over 1 GiB"
        managed.restart()
    return record


async def run_server(managed: Managed, cases: list[Case], args) -> list[dict]:
    records = []
    for case in cases:
        print(f"{managed.server.name}: {case.name} ...", end="", file=sys.stderr, flush=True)
        record = await run_case(case, managed, args)
        records.append(record)
        p = record["probe"]
        print(f" {record['answer'][:100]} | probe max {p['max_ms']} ms | peak {_mib(record['peak_growth_mib'])} MiB"
              f" | retained {_mib(record['retained_mib'])} MiB" + (" | DIED" if record["died"] else "")
              + (" | HUNG" if record["hung"] else ""), file=sys.stderr, flush=True)
    return records


# ---------------------------------------------------------------------------------------------
# Report

def summary(records: list[dict]) -> dict:
    stalled = [r["case"] for r in records if (r["probe"]["max_ms"] or 0) > STALL_MS]
    return dict(stalled=stalled, died=[r["case"] for r in records if r["died"]],
                hung=[r["case"] for r in records if r["hung"]],
                retained_over_50=[r["case"] for r in records if (r["retained_mib"] or 0) > GROWTH_MIB],
                memory_growth=[r["case"] for r in records if (r["peak_growth_mib"] or 0) > GROWTH_MIB])


def _mib(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}".replace("-0", "0") if abs(value) >= 0.5 else "0"


def table(results: dict[str, list[dict]]) -> str:
    """One row per case and server; then a summary line per server."""
    lines = [markdown_row(("case", "server", "answer", "probe max (p99) ms", f"probes > {STALL_MS} ms",
                           "peak +MiB", "retained +MiB", "died")),
             markdown_row(("---",) * 3 + ("---:",) * 4 + ("---",))]
    names = list(results)
    order = list(dict.fromkeys(r["case"] for recs in results.values() for r in recs))
    for case in order:
        for name in names:
            for r in results[name]:
                if r["case"] != case:
                    continue
                p = r["probe"]
                answer = r["answer"].replace("|", "/").replace("\n", " ")
                lines.append(markdown_row((
                    case, name, answer[:160] + ("…" if len(answer) > 160 else ""),
                    f"{p['max_ms']:.0f} ({p['p99_ms']:.0f})" if p["max_ms"] is not None else "–",
                    "none" if not p["over_stall"] else f"**{p['over_stall']} of {p['n']}**",
                    _mib(r["peak_growth_mib"]), _mib(r["retained_mib"]),
                    ("**died**" if r["died"] else "**hung**" if r["hung"] else "no")
                    + (" (restarted)" if r.get("restarted") == "retained over 1 GiB" else ""))))
    lines.append("")
    for name in names:
        s = summary(results[name])
        lines.append(f"- **{name}**: stalled a normal request past {STALL_MS} ms in {len(s['stalled'])} of "
                     f"{len(results[name])} cases ({', '.join(s['stalled']) or 'none'}); died in "
                     f"{len(s['died'])} ({', '.join(s['died']) or 'none'})"
                     + (f", hung in {len(s['hung'])} ({', '.join(s['hung'])})" if s["hung"] else "")
                     + f"; retained > {GROWTH_MIB} MiB in {len(s['retained_over_50'])} "
                     f"({', '.join(s['retained_over_50']) or 'none'}); memory-growth cases (peak > "
                     f"{GROWTH_MIB} MiB): {len(s['memory_growth'])} ({', '.join(s['memory_growth']) or 'none'})")
    return "\n".join(lines)


def out_path(out_dir: Path) -> Path:
    """<out>/<date>-hostile.json, or -2, -3 ... when that day already has one."""
    stem = time.strftime("%Y-%m-%d") + "-hostile"
    path, n = out_dir / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = out_dir / f"{stem}-{n}.json"
    return path


def shm_ours(pids: set[int]) -> list[str]:
    """/dev/shm segments named after one of our shmserve PIDs."""
    found = []
    for name in os.listdir("/dev/shm"):
        parts = name.split(".")
        if name.startswith("shmserve.") and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) in pids:
            found.append(name)
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(ap)
    ap.add_argument("--servers", nargs="+", choices=SERVER_NAMES,
                    help="the servers to attack, in this order (default: both; shmserve alone when the "
                         "anchors are missing)")
    ap.add_argument("--cases", help="comma-separated case names (default: all); see --list")
    ap.add_argument("--quick", action="store_true",
                    help="skip the cases that wait 40 s (idle_one_byte, idle_after_settings, http_stalled_body), "
                         "unless --cases names them")
    ap.add_argument("--list", action="store_true", help="print the cases and what each sends, and exit")
    ap.add_argument("--out", type=Path, default=PERF_DIR / "results",
                    help="where the JSON, the table and the servers' logs go (default perf/results)")
    ap.add_argument("--rss-limit-mib", type=int, default=6144,
                    help="stop an attack when the server's RSS passes this (a safety for the machine; "
                         "default 6144)")
    args = ap.parse_args()
    if args.list:
        for case in CASES:
            print(f"{case.name}{' (slow)' if case.slow else ''}: {' '.join(case.run.__doc__.split())}\n")
        return 0
    cases = CASES
    if args.cases:
        wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
        unknown = [w for w in wanted if w not in {c.name for c in CASES}]
        if unknown:
            ap.error(f"unknown case(s) {unknown}; see --list")
        cases = [c for c in CASES if c.name in wanted]
    elif args.quick:
        cases = [c for c in cases if not c.slow]
    names = args.servers or ([args.only] if args.only else list(SERVER_NAMES))
    env, note = None, None
    try:
        env = anchors_env(args.anchors)
        if not Path(env.get("TRITONSERVER", "")).exists():
            raise FileNotFoundError(env.get("TRITONSERVER"))
    except (subprocess.CalledProcessError, FileNotFoundError, OSError) as e:
        note = f"anchors missing or incomplete at {args.anchors} ({e})"
        if "triton" in names:
            if args.servers or args.only:
                print(f"error: {note}", file=sys.stderr)
                return 2
            names = [n for n in names if n != "triton"]
            print(f"{note}: measuring shmserve only", file=sys.stderr)

    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = out_path(args.out)
    log_stem = json_path.with_suffix("")
    if any(c.name.endswith("gzip_bomb") for c in cases):
        print("making the gzip bomb (1 GiB of zeros) ...", file=sys.stderr, flush=True)
        gzip_bomb()
    tmp = Path(tempfile.mkdtemp(prefix="hostile-repo-"))
    shutil.copytree(PERF_DIR / "triton_repo" / MODEL, tmp / MODEL)
    results: dict[str, list[dict]] = {}
    problems: list[str] = []
    shm_pids: set[int] = set()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t_run = time.monotonic()
    try:
        for name in names:
            server = (TritonServer(args.anchors, env, tmp, Path(os.devnull)) if name == "triton"
                      else ShmServer(tmp, tuple(args.shmserve_ports), Path(os.devnull)))
            managed = Managed(server, log_stem)
            try:
                managed.start()
                results[name] = asyncio.run(run_server(managed, cases, args))
                problems += [f"{name}: {r['case']}: benchmark error {r['benchmark_error']}"
                             for r in results[name] if r.get("benchmark_error")]
            except (ServerError, OSError, subprocess.SubprocessError) as e:
                problems.append(f"{name}: {e}")
                print(f"ERROR: {name}: {e}", file=sys.stderr)
            finally:
                managed.stop()
                if name == "shmserve":
                    shm_pids |= managed.pids
                if managed.leftovers:
                    problems.append(f"{name}: processes {managed.leftovers} outlived the server (killed)")
    except KeyboardInterrupt:
        problems.append("interrupted (Ctrl-C)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        left = shm_ours(shm_pids)
        if left:
            problems.append(f"/dev/shm segments left by shmserve (removed): {left[:5]}{'...' if len(left) > 5 else ''}")
            for name in left:
                try:
                    os.unlink(f"/dev/shm/{name}")
                except OSError:
                    pass
        git = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True).stdout.strip()
        doc = dict(started_utc=started, duration_s=round(time.monotonic() - t_run), git_head=git,
                   cpus=os.cpu_count(), args={k: str(v) for k, v in vars(args).items()},
                   cases=[c.name for c in cases], note=note, problems=problems,
                   thresholds=dict(stall_ms=STALL_MS, growth_mib=GROWTH_MIB, probe_timeout_ms=PROBE_TIMEOUT_S * 1000),
                   servers={name: dict(cases=recs, summary=summary(recs)) for name, recs in results.items()})
        json_path.write_text(json.dumps(doc, indent=1) + "\n")
    text = table(results) + "".join(f"\n- problem: {p}" for p in problems)
    json_path.with_suffix(".md").write_text(text + "\n")
    print(text)
    print(f"\nresults: {json_path}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
