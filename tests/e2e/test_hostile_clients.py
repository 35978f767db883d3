"""Hostile clients against a real server: small inputs that once froze or killed it (a
ModelInfer of zeros, a gzip bomb, a SETTINGS frame of many window sizes, header blocks of
table size updates, huge model names, a PING flood, unfinished header blocks, calls announcing
2 GiB), each answered at once while another client is served, memory coming back. Raw HTTP/2
frames, built here; perf/hostile.py measures the same against Triton.

Timing is only bounded from above, generously: what was a freeze took tens of seconds.
"""

import socket
import struct
import threading
import time
import urllib.parse
import zlib

import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from tests.conftest import start_server, stop_server

# Among the longest modules of the suite (pytest --durations): -m "not slow" skips it.
pytestmark = pytest.mark.slow

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    0, 1, 3, 4, 6, 7, 8, 9)
END_STREAM, END_HEADERS = 1, 4
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
IDLE_MS = 2000
WAIT_S = 20.0


@pytest.fixture(scope="module")
def hostile(test_repository, tmp_path_factory):
    log_path = str(tmp_path_factory.mktemp("hostile_logs") / "shmserve.log")
    srv = start_server(test_repository, log_path, f"--grpc-max-connection-idle={IDLE_MS}",
                       wait_models=("identity_fp32",))
    yield srv
    stop_server(srv)


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((ftype, flags)) + struct.pack(
        ">I", sid) + payload


def request_block(path: str = INFER, extra=()) -> bytes:
    return hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                   (":authority", "x"), ("content-type", "application/grpc"),
                                   ("te", "trailers"), *extra])


def message(payload: bytes, compressed: int = 0) -> bytes:
    return bytes([compressed]) + len(payload).to_bytes(4, "big") + payload


class Raw:
    """A client connection that sends what it is told and reads frames as they come."""

    def __init__(self, server, settings: bytes = b""):
        self.sock = socket.create_connection(("127.0.0.1", server.grpc_port), timeout=WAIT_S)
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0, settings))
        self.buf = b""
        self.decoder = hpack.Decoder()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def frames(self, until, limit_s: float = WAIT_S) -> list:
        """Frames (type, flags, stream, payload) read until `until(frame)` is true of one,
        or the connection ends."""
        out = []
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            while len(self.buf) >= 9:
                length = int.from_bytes(self.buf[:3], "big")
                if len(self.buf) < 9 + length:
                    break
                f = (self.buf[3], self.buf[4], int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF,
                     self.buf[9:9 + length])
                self.buf = self.buf[9 + length:]
                if f[0] == SETTINGS and not f[1] & 1:
                    try:
                        self.send(frame(SETTINGS, 1, 0))
                    except (BrokenPipeError, ConnectionResetError):
                        pass  # the server closed: what it sent is still read
                out.append(f)
                if until(f):
                    return out
            try:
                data = self.sock.recv(1 << 20)
            except (ConnectionResetError, TimeoutError):
                data = b""
            if not data:
                return out
            self.buf += data
        raise AssertionError(f"nothing ended the wait within {limit_s} s: {out[-5:]}")

    def status(self, sid: int) -> dict:
        """The headers of stream `sid`'s answer that carry its gRPC status."""
        for f in self.frames(lambda f: f[0] == HEADERS and f[2] == sid and f[1] & END_STREAM):
            if f[0] == HEADERS:
                headers = dict(self.decoder.decode(f[3]))
                if f[2] == sid and "grpc-status" in headers:
                    return headers
        raise AssertionError("the connection ended without an answer")

    def goaway(self) -> tuple:
        """(error code, debug data) of the GOAWAY the server sends."""
        for f in self.frames(lambda f: f[0] == GOAWAY):
            if f[0] == GOAWAY:
                return struct.unpack(">I", f[3][4:8])[0], f[3][8:]
        raise AssertionError("the connection ended without GOAWAY")

    def closed(self) -> bool:
        """Whether the server closes the connection (having read all that was sent)."""
        self.frames(lambda f: False)
        return True

    def close(self) -> None:
        self.sock.close()


def rss_mib(server) -> float:
    with open(f"/proc/{server.process.pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def assert_memory_comes_back(server, before: float, limit_mib: float = 50) -> None:
    """The front's RSS comes back to within `limit_mib` of `before` (its freed heap goes
    back to the kernel within a second, see shmserve/ipc/malloc.py)."""
    deadline = time.monotonic() + 5
    while rss_mib(server) - before >= limit_mib and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rss_mib(server) - before < limit_mib


def served(server) -> None:
    """A normal client is answered meanwhile (within WAIT_S: the freezes took longer)."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        data = np.arange(4, dtype=np.float32).reshape(1, 4)
        t = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        t.set_data_from_numpy(data)
        result = client.infer("identity_fp32", [t], client_timeout=WAIT_S)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    finally:
        client.close()


class Meanwhile:
    """Runs `served` in a thread while the block runs; raises what it raised."""

    def __init__(self, server):
        self.server = server
        self.error = None
        self.thread = threading.Thread(target=self._run)

    def _run(self):
        try:
            time.sleep(0.2)
            served(self.server)
        except BaseException as exc:  # reported by __exit__
            self.error = exc

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.thread.join(WAIT_S + 5)
        if self.error is not None and exc[0] is None:
            raise self.error


def test_a_model_infer_of_zeros_is_refused_at_its_first_field(hostile):
    before = rss_mib(hostile)
    raw = Raw(hostile)
    raw.send(frame(HEADERS, END_HEADERS, 1, request_block()))
    body = message(bytes(8 << 20))
    with Meanwhile(hostile):
        for start in range(0, len(body), 16384):  # the default frame size; windows are ample
            chunk = body[start:start + 16384]
            try:
                raw.send(frame(DATA, END_STREAM if start + 16384 >= len(body) else 0, 1, chunk))
            except (BrokenPipeError, ConnectionResetError):
                break
        answer = raw.status(1)
    raw.close()
    assert answer["grpc-status"] == "3" and "field number 0" in answer["grpc-message"]
    assert_memory_comes_back(hostile, before)


def test_a_gzip_bomb_is_refused_once_it_inflates_past_the_limit(hostile):
    packer = zlib.compressobj(wbits=31)
    zeros = bytes(1 << 20)
    bomb = b"".join(packer.compress(zeros) for _ in range(1024)) + packer.flush()  # 1 GiB
    before = rss_mib(hostile)
    raw = Raw(hostile)
    raw.send(frame(HEADERS, END_HEADERS, 1, request_block(extra=[("grpc-encoding", "gzip")])))
    body = message(bomb, compressed=1)
    with Meanwhile(hostile):
        for start in range(0, len(body), 16384):
            raw.send(frame(DATA, END_STREAM if start + 16384 >= len(body) else 0, 1,
                           body[start:start + 16384]))
        answer = raw.status(1)
    raw.close()
    assert answer["grpc-status"] == "8"  # RESOURCE_EXHAUSTED
    assert "--grpc-max-decompressed-size" in urllib.parse.unquote(answer["grpc-message"])
    assert_memory_comes_back(hostile, before)


def test_a_settings_frame_of_many_window_sizes_with_streams_open(hostile):
    raw = Raw(hostile)
    block = request_block()
    # Calls waiting for their message, as many as a connection may have.
    raw.send(b"".join(frame(HEADERS, END_HEADERS, sid, block) for sid in range(1, 2049, 2)))
    entries = b"".join(struct.pack(">HI", 4, 65535 + i % 2) for i in range(2730))  # 16 KiB
    with Meanwhile(hostile):
        raw.send(frame(SETTINGS, 0, 0, entries))
        raw.frames(lambda f: f[0] == SETTINGS and f[1] & 1)  # acknowledged
    raw.close()


@pytest.mark.parametrize("size", [16384, 1 << 20])
def test_header_blocks_of_table_size_updates_end_the_connection(hostile, size):
    """A block of 1 MiB is refused once it passes the advertised 16 KiB (the server closes
    with bytes unread, so the client may see a reset instead of the GOAWAY); one within it,
    for having more than two updates."""
    raw = Raw(hostile)
    block = b"\x20" * size + request_block()
    data = frame(HEADERS, 0 if size > 16384 else END_HEADERS, 1, block[:16384]) + b"".join(
        frame(CONTINUATION, 0, 1, block[start:start + 16384])
        for start in range(16384, len(block), 16384))
    with Meanwhile(hostile):
        try:
            raw.send(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed before all was sent
        if size <= 16384:
            code, debug = raw.goaway()
            assert code == 0x9 and b"table size updates" in debug  # COMPRESSION_ERROR
        assert raw.closed()
    raw.close()


def test_huge_model_names_get_a_short_answer_and_leave_nothing_behind(hostile):
    before = rss_mib(hostile)
    raw = Raw(hostile)
    wire = service_pb2.ModelInferRequest(model_name="m" * 4_000_000).SerializeToString()
    with Meanwhile(hostile):
        for i in range(10):
            sid = 2 * i + 1
            raw.send(frame(HEADERS, END_HEADERS, sid, request_block()))
            body = message(wire)
            for start in range(0, len(body), 16384):
                raw.send(frame(DATA, END_STREAM if start + 16384 >= len(body) else 0, sid,
                               body[start:start + 16384]))
            answer = raw.status(sid)
            assert answer["grpc-status"] == "5"  # NOT_FOUND
            assert len(answer["grpc-message"]) < 1100
            assert answer["grpc-message"].startswith("Request for unknown model: 'mmm")
    raw.close()
    assert_memory_comes_back(hostile, before)


def test_a_ping_flood_is_cut_off_by_the_ping_policy(hostile):
    """Triton's (gRPC's) policy, its defaults: with no call open, a PING, then two strikes;
    the fourth ends the connection."""
    raw = Raw(hostile)
    raw.send(frame(PING, 0, 0, b"12345678") * 4)
    assert raw.goaway() == (0xB, b"too_many_pings")  # ENHANCE_YOUR_CALM
    raw.close()


def test_unfinished_header_blocks_are_refused_past_the_header_list_size(hostile):
    before = rss_mib(hostile)
    conns = [Raw(hostile) for _ in range(50)]
    for raw in conns:
        raw.send(frame(HEADERS, 0, 1, b"\x88" * 16000) + frame(CONTINUATION, 0, 1, b"\x88" * 500))
    for raw in conns:
        assert raw.goaway()[0] == 0x9  # COMPRESSION_ERROR: not decoded
        raw.close()
    served(hostile)
    assert_memory_comes_back(hostile, before)


def test_calls_announcing_2_gib_of_garbage_are_refused_before_its_end(hostile):
    raw = Raw(hostile)
    block = request_block()
    sids = list(range(1, 17, 2))
    for sid in sids:
        raw.send(frame(HEADERS, END_HEADERS, sid, block)
                 + frame(DATA, 0, sid, b"\0" + (2**31 - 1).to_bytes(4, "big")))
    sent = {sid: 5 for sid in sids}
    windows = {sid: 65535 - 5 for sid in sids}
    answered = {}
    with Meanwhile(hostile):
        while len(answered) < len(sids):
            for sid in sids:
                room = min(windows[sid], 16384)
                if sid not in answered and room:
                    raw.send(frame(DATA, 0, sid, bytes(room)))
                    windows[sid] -= room
                    sent[sid] += room
            for f in raw.frames(lambda f: True, limit_s=WAIT_S):
                if f[0] == WINDOW_UPDATE and f[2] in windows:
                    windows[f[2]] += int.from_bytes(f[3], "big")
                elif f[0] == HEADERS and f[1] & END_STREAM:
                    answered[f[2]] = dict(raw.decoder.decode(f[3]))["grpc-status"]
                elif f[0] == HEADERS:
                    raw.decoder.decode(f[3])
    raw.close()
    assert set(answered.values()) == {"3"}  # INVALID_ARGUMENT, each
    assert max(sent.values()) <= 65535  # refused within the first window


def test_one_clients_streams_do_not_lock_others_out(hostile):
    raw = Raw(hostile)
    block = request_block(STREAM_INFER)
    raw.send(b"".join(frame(HEADERS, END_HEADERS, sid, block) for sid in range(1, 601, 2)))
    refused = raw.status(2 * 256 + 1)  # the 257th streaming call of this connection
    assert refused["grpc-status"] == "14"  # UNAVAILABLE
    assert "--max-open-streams-per-connection" in urllib.parse.unquote(
        refused["grpc-message"])
    results = []
    client = grpcclient.InferenceServerClient(hostile.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: results.append((result, error)))
        t = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        t.set_data_from_numpy(np.ones((1, 4), np.float32))
        client.async_stream_infer("identity_fp32", [t])
        deadline = time.monotonic() + WAIT_S
        while not results and time.monotonic() < deadline:
            time.sleep(0.01)
        client.stop_stream()
    finally:
        client.close()
        raw.close()
    assert results and results[0][1] is None


def test_a_connection_without_calls_is_sent_goaway_after_the_idle_time(hostile):
    raw = Raw(hostile)
    started = time.monotonic()
    assert raw.goaway() == (0, b"max_idle")
    assert IDLE_MS / 1000 <= time.monotonic() - started < WAIT_S
    raw.close()
