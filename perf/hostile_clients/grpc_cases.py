"""The attacks carried by gRPC calls: messages that are no protobuf, inflate to 1 GiB, name huge
models or announce 2 GiB; streams that use up a server's pool; bad arguments to the shared
memory and repository calls. Each returns the answer as a short text and puts its figures in
ctx.details."""
import asyncio
import collections
import json
import struct
import time
import urllib.parse

from tritonclient.grpc import service_pb2

from .case import Ctx
from .h2 import INFER, SERVICE, STREAM_INFER, S_MAX_CONCURRENT_STREAMS, Stream, grpc_code
from .http1 import http_request
from .payloads import MIB, MODEL, grpc_message, gzip_bomb, infer_request


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
