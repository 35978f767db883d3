"""The attacks on the HTTP/1.1 port: deep pipelining, a body that stalls, slow heads (slowloris)
and a gzip bomb. Each returns the answer as a short text and puts its figures in ctx.details."""
import asyncio
import collections

from .case import Ctx
from .http1 import http_request
from .payloads import MODEL, gzip_bomb


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
