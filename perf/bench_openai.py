"""What the OpenAI chat route costs over generate_stream, on one shmserve, in one run: the
bundled `textgen` streaming TOKENS characters per request, through `/v1/chat/completions`
(stream: true) and through `/v2/models/textgen/generate_stream`, both server-sent events over
HTTP, at concurrency 1 and 16.

    .venv/bin/python perf/bench_openai.py [--rounds 5] [--requests-each 24] [--tokens 64]

Both routes get the same prompt: generate_stream is sent the text the chat template renders
from the chat request's messages. Rounds alternate the two routes' order; the table gives, per
route and concurrency, the median over rounds of tokens/s (all streams together) and of the
median time to the first token (the first chunk with text; the chat route's opening chunk,
which names the role, does not count), and against the targets the median over rounds of the
two routes' paired figures: the OpenAI route keeps >= 0.9 of generate_stream's tokens/s and
adds <= 0.3 ms to the first token. Writes
everything under perf/results/openai-<time>/.
"""
import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import aiohttp

from servers import PERF_DIR, REPO_ROOT, ServerError, ShmServer, fmt, markdown_row, publish

from shmserve.openai import chat_templates

MODEL = "textgen"
MESSAGES = [{"role": "user", "content": "We hold these truths"}]
TARGET_MIN_THROUGHPUT = 0.9  # OpenAI route / generate_stream, tokens/s
TARGET_MAX_ADDED_TTFT_MS = 0.3


def bodies(tokens: int) -> dict:
    """Each route's request body for stream k: greedy decoding with a seed per request, so
    both routes do the same work."""
    template = chat_templates.load(str(REPO_ROOT / "model_repository" / MODEL / "tokenizer"))
    prompt = template.render(MESSAGES)
    return {
        "generate_stream": lambda seed: (f"/v2/models/{MODEL}/generate_stream", {
            "text_input": prompt, "max_tokens": tokens, "stream": True, "seed": seed,
            "temperature": 0.7}),
        "openai_chat": lambda seed: ("/v1/chat/completions", {
            "model": MODEL, "messages": MESSAGES, "max_tokens": tokens, "stream": True,
            "seed": seed}),
    }


def text_of(route: str, event: dict) -> str:
    if route == "openai_chat":
        return event["choices"][0]["delta"].get("content") or "" if event["choices"] else ""
    return event.get("text_output", "")


async def one_request(session, base: str, route: str, make, seed: int) -> tuple[float, int]:
    """(seconds to the first token, tokens) of one streamed request."""
    path, body = make(seed)
    start = time.perf_counter()
    first, tokens = None, 0
    async with session.post(base + path, json=body) as response:
        if response.status != 200:
            raise ServerError(f"{route}: {response.status} {await response.text()}")
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise ServerError(f"{route}: {event['error']}")
            text = text_of(route, event)
            if text:
                tokens += len(text)
                if first is None:
                    first = time.perf_counter() - start
    return first if first is not None else float("nan"), tokens


async def measure(base: str, route: str, make, concurrency: int, requests_each: int) -> dict:
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        # Not counted: the first request after an idle spell pays wake-ups on every side.
        await one_request(session, base, route, make, 10**6)

        async def stream(k):
            return [await one_request(session, base, route, make, k * 1000 + i)
                    for i in range(requests_each)]
        start = time.perf_counter()
        results = [r for rs in await asyncio.gather(*(stream(k) for k in range(concurrency)))
                   for r in rs]
        elapsed = time.perf_counter() - start
    firsts = [first * 1000 for first, _ in results]
    tokens = sum(count for _, count in results)
    return dict(route=route, concurrency=concurrency, requests=len(results), tokens=tokens,
                tokens_per_s=tokens / elapsed, first_token_ms_p50=statistics.median(firsts))


def report(records: list) -> str:
    """Per route, the medians over rounds; against the targets, the medians of the rounds'
    paired figures (the OpenAI route over generate_stream in the same round), which the
    machine's drift from round to round leaves alone."""
    lines = [markdown_row(["concurrency", "route", "tokens/s", "first token ms (p50)",
                           "tokens/s ratio (>= 0.9)", "added first token ms (<= 0.3)"]),
             markdown_row(["---"] * 6)]
    for c in sorted({r["concurrency"] for r in records}):
        by_round = {}
        for r in records:
            if r["concurrency"] == c:
                by_round.setdefault(r["round"], {})[r["route"]] = r
        pairs = [(rs["generate_stream"], rs["openai_chat"]) for rs in by_round.values()
                 if len(rs) == 2]
        for route, i in (("generate_stream", 0), ("openai_chat", 1)):
            rs = [p[i] for p in pairs]
            paired = i == 1 and bool(pairs)
            lines.append(markdown_row([
                str(c), route, fmt(statistics.median(r["tokens_per_s"] for r in rs), ".0f"),
                fmt(statistics.median(r["first_token_ms_p50"] for r in rs), ".2f"),
                fmt(statistics.median(o["tokens_per_s"] / g["tokens_per_s"] for g, o in pairs),
                    ".3f") if paired else "",
                fmt(statistics.median(o["first_token_ms_p50"] - g["first_token_ms_p50"]
                                      for g, o in pairs), "+.2f") if paired else ""]))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests-each", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--from-results", type=Path, metavar="DIR",
                    help="only print the table of a run's results.jsonl")
    ap.add_argument("--shmserve-ports", type=int, nargs=3, default=[18100, 18101, 18102],
                    metavar=("HTTP", "GRPC", "METRICS"))
    args = ap.parse_args()
    if args.from_results:
        with open(args.from_results / "results.jsonl") as f:
            print(report([json.loads(line) for line in f]))
        return 0
    out_dir = PERF_DIR / "results" / time.strftime("openai-%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True)
    server = ShmServer(REPO_ROOT / "model_repository", tuple(args.shmserve_ports),
                       out_dir / "shmserve.log")
    routes = bodies(args.tokens)
    base = f"http://127.0.0.1:{server.http_port}"
    records, errors = [], []
    try:
        server.start()
        server.wait_model_ready(MODEL)
        for r in range(args.rounds):
            order = list(routes) if r % 2 == 0 else list(reversed(routes))
            for c in (1, 16):
                for name in order:
                    rec = dict(round=r, **asyncio.run(
                        measure(base, name, routes[name], c, args.requests_each)))
                    print(json.dumps(rec), file=sys.stderr, flush=True)
                    records.append(rec)
    except (ServerError, OSError, aiohttp.ClientError) as e:
        errors.append(repr(e))
    finally:
        leftovers = server.stop()
    if leftovers:
        errors.append(f"processes {leftovers} outlived the server (killed)")
    with open(out_dir / "results.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    text = f"# OpenAI chat route vs generate_stream, {MODEL}, {args.tokens} tokens a request\n\n"
    return publish(out_dir, text + (report(records) if records else "no results"), errors)


if __name__ == "__main__":
    sys.exit(main())
