"""Closed-loop load generator for identity_fp32 (FP32 [1,16], 64 B) over gRPC or HTTP.

    .venv/bin/python perf/loadgen.py --protocol grpc --port 18001 --concurrency 8

N requests stay in flight: each one is sent again as soon as its reply arrives. The client must
not be the bottleneck, so it avoids tritonclient's per-request work: the concurrency is split over
several worker processes, each running asyncio (uvloop). gRPC sends one pre-serialized
ModelInferRequest through grpcio's own channel on the raw ModelInfer method; HTTP posts one
prebuilt body in the binary tensor extension with aiohttp, on a keep-alive connection per
in-flight request. Each worker checks once that OUTPUT0 equals INPUT0 before the load starts.

After a warm-up, requests completing within `windows` back-to-back windows of `window_s` are
counted: throughput over all windows (and per window, to see the spread), latency percentiles
over those requests. The workers share the system's monotonic clock, so the parent sets one
schedule for all of them.
"""
import argparse
import asyncio
import json
import multiprocessing as mp
import os
import signal
import sys
import time
from array import array
from collections.abc import Callable
from dataclasses import asdict, dataclass

import aiohttp
import grpc
import numpy as np
import uvloop
from tritonclient.grpc import service_pb2

MODEL = "identity_fp32"
SHAPE = (1, 16)
DATA = np.linspace(-1.0, 1.0, SHAPE[0] * SHAPE[1], dtype=np.float32).reshape(SHAPE)
GRPC_METHOD = "/inference.GRPCInferenceService/ModelInfer"
# Time between sending the schedule and the start of the warm-up, so that every worker has it.
SCHEDULE_LEAD_S = 0.1


class LoadgenError(RuntimeError):
    pass


@dataclass
class LoadResult:
    infer_per_s: float
    p50_ms: float
    p99_ms: float
    avg_ms: float
    window_infer_per_s: list[float]
    window_spread: float  # (max - min) / median of the per-window throughputs
    client_cpu_cores: float  # all workers together, over the measured windows
    procs: int
    server_cpu_cores: float | None = None  # over the measured windows, when run() is given server_cpu


def _check_output(out: bytes, where: str) -> None:
    if out != DATA.tobytes():
        raise LoadgenError(f"{where}: OUTPUT0 {np.frombuffer(out, np.float32)} differs from INPUT0 {DATA.ravel()}")


async def _grpc_senders(host: str, port: int, n: int):
    """n senders sharing one channel (one HTTP/2 connection), and how to close it."""
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=list(SHAPE))
    request.raw_input_contents.append(DATA.tobytes())
    request.outputs.add(name="OUTPUT0")
    payload = request.SerializeToString()

    channel = grpc.aio.insecure_channel(f"{host}:{port}")
    # No serializers: the bytes go out as they are and the reply comes back unparsed.
    infer = channel.unary_unary(GRPC_METHOD, request_serializer=None, response_deserializer=None)

    reply = service_pb2.ModelInferResponse.FromString(await infer(payload))
    names = [o.name for o in reply.outputs]
    if names != ["OUTPUT0"] or reply.outputs[0].datatype != "FP32" or list(reply.outputs[0].shape) != list(SHAPE):
        raise LoadgenError(f"grpc: unexpected outputs {reply.outputs}")
    _check_output(reply.raw_output_contents[0], "grpc")

    async def send() -> None:
        if not await infer(payload):
            raise LoadgenError("grpc: empty ModelInfer response")

    return [send] * n, channel.close


async def _http_senders(host: str, port: int, n: int):
    """n senders, each with a session of its own holding one keep-alive connection."""
    url = f"http://{host}:{port}/v2/models/{MODEL}/infer"
    header = json.dumps({
        "inputs": [{"name": "INPUT0", "shape": list(SHAPE), "datatype": "FP32",
                    "parameters": {"binary_data_size": DATA.nbytes}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }, separators=(",", ":")).encode()
    body = header + DATA.tobytes()
    headers = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}
    # No Accept-Encoding: like perf_analyzer, ask for uncompressed replies (Triton gzips them otherwise).
    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), cookie_jar=aiohttp.DummyCookieJar(),
                                      skip_auto_headers=("Accept-Encoding", "User-Agent"), auto_decompress=False)
                for _ in range(n)]

    async def close() -> None:
        await asyncio.gather(*(s.close() for s in sessions))

    try:
        async with sessions[0].post(url, data=body, headers=headers) as r:
            reply = await r.read()
            if r.status != 200:
                raise LoadgenError(f"http: status {r.status}: {reply[:300]!r}")
            json_len = int(r.headers["Inference-Header-Content-Length"])
        outputs = json.loads(reply[:json_len])["outputs"]
        if [o["name"] for o in outputs] != ["OUTPUT0"] or outputs[0]["shape"] != list(SHAPE):
            raise LoadgenError(f"http: unexpected outputs {outputs}")
        _check_output(reply[json_len:], "http")
    except BaseException:
        await close()
        raise

    def sender(session):
        async def send() -> None:
            async with session.post(url, data=body, headers=headers) as r:
                reply = await r.read()
                if r.status != 200 or not reply:
                    raise LoadgenError(f"http: status {r.status}: {reply[:300]!r}")
        return send

    return [sender(s) for s in sessions], close


SENDERS = {"grpc": _grpc_senders, "http": _http_senders}


async def _drive(conn, protocol: str, host: str, port: int, inflight: int):
    senders, close = await SENDERS[protocol](host, port, inflight)
    try:
        conn.send(("ready", None))
        start, measure_from, until = conn.recv()
        clock = time.monotonic
        ends, latencies = array("d"), array("d")

        async def closed_loop(send) -> None:
            await asyncio.sleep(max(0.0, start - clock()))
            while (t0 := clock()) < until:
                await send()
                t1 = clock()
                if measure_from <= t1 < until:
                    ends.append(t1)
                    latencies.append(t1 - t0)

        async def cpu_seconds() -> float:
            await asyncio.sleep(max(0.0, measure_from - clock()))
            cpu0 = time.process_time()
            await asyncio.sleep(max(0.0, until - clock()))
            return time.process_time() - cpu0

        cpu, *_ = await asyncio.gather(cpu_seconds(), *(closed_loop(s) for s in senders))
        return ends, latencies, cpu
    finally:
        await close()


def _worker(conn, protocol: str, host: str, port: int, inflight: int) -> None:
    # Ctrl-C reaches the whole process group: the parent handles it and terminates the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        result = uvloop.run(_drive(conn, protocol, host, port, inflight))
    except Exception as e:  # reported to the parent, which raises it
        conn.send(("error", f"{type(e).__name__}: {e}"))
    else:
        conn.send(("done", result))


def _receive(proc, conn, expected: str, timeout_s: float):
    if not conn.poll(timeout_s):
        raise LoadgenError(f"worker {proc.pid}: nothing within {timeout_s:.0f} s (waiting for {expected})")
    try:
        kind, value = conn.recv()
    except EOFError:
        proc.join(1)
        raise LoadgenError(f"worker {proc.pid} exited with {proc.exitcode} (waiting for {expected})") from None
    if kind == "error":
        raise LoadgenError(f"worker {proc.pid}: {value}")
    return value


def default_procs(concurrency: int) -> int:
    return min(concurrency, max(2, (os.cpu_count() or 2) // 2))


def run(protocol: str, host: str, port: int, concurrency: int, procs: int | None = None,
        warmup_s: float = 2.0, windows: int = 3, window_s: float = 2.0, ready_timeout_s: float = 60,
        server_cpu: Callable[[], float] | None = None) -> LoadResult:
    """One measurement; raises LoadgenError on any failed request or worker. Every worker is
    terminated before this returns or raises. server_cpu, if given, returns the server's CPU seconds
    so far; it is read when the measured windows begin and end."""
    procs = min(procs or default_procs(concurrency), concurrency)
    shares = [concurrency // procs + (i < concurrency % procs) for i in range(procs)]
    # spawn, not fork: the caller may already hold gRPC channels, whose threads do not survive a fork.
    ctx = mp.get_context("spawn")
    workers = []
    try:
        for share in shares:
            conn, child_conn = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child_conn, protocol, host, port, share), daemon=True)
            proc.start()
            child_conn.close()
            workers.append((proc, conn))
        for proc, conn in workers:
            _receive(proc, conn, "ready", ready_timeout_s)
        start = time.monotonic() + SCHEDULE_LEAD_S
        measure_from = start + warmup_s
        until = measure_from + windows * window_s
        for _, conn in workers:
            conn.send((start, measure_from, until))
        server_cores = None
        if server_cpu is not None:
            time.sleep(max(0.0, measure_from - time.monotonic()))
            cpu0 = server_cpu()
            time.sleep(max(0.0, until - time.monotonic()))
            server_cores = (server_cpu() - cpu0) / (until - measure_from)
        results = [_receive(proc, conn, "results", until - time.monotonic() + 30) for proc, conn in workers]
    finally:
        # Signal them all before waiting for any, in case a second Ctrl-C cuts the waiting short.
        for proc, conn in workers:
            conn.close()
            if proc.is_alive():
                proc.terminate()
        for proc, _ in workers:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()

    ends = np.concatenate([np.asarray(e, dtype=np.float64) for e, _, _ in results])
    latencies_ms = np.concatenate([np.asarray(lat, dtype=np.float64) for _, lat, _ in results]) * 1000.0
    if latencies_ms.size == 0:
        raise LoadgenError("no request completed within the measured windows")
    per_window = np.histogram(ends, bins=windows, range=(measure_from, until))[0] / window_s
    p50, p99 = np.percentile(latencies_ms, [50, 99])
    median_window = float(np.median(per_window))
    return LoadResult(
        infer_per_s=ends.size / (windows * window_s), p50_ms=float(p50), p99_ms=float(p99),
        avg_ms=float(latencies_ms.mean()), window_infer_per_s=[float(x) for x in per_window],
        window_spread=float((per_window.max() - per_window.min()) / median_window) if median_window else 0.0,
        client_cpu_cores=sum(cpu for _, _, cpu in results) / (windows * window_s), procs=procs,
        server_cpu_cores=server_cores)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--protocol", choices=sorted(SENDERS), required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True, help="the server's gRPC or HTTP port")
    ap.add_argument("--concurrency", type=int, required=True, help="requests in flight")
    ap.add_argument("--procs", type=int, help="worker processes (default: min(concurrency, max(2, CPUs / 2)))")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds (default 2)")
    ap.add_argument("--windows", type=int, default=3, help="measured windows (default 3)")
    ap.add_argument("--window-s", type=float, default=2.0, help="seconds per window (default 2)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the workers are terminated
    try:
        result = run(args.protocol, args.host, args.port, args.concurrency, args.procs,
                     args.warmup, args.windows, args.window_s)
    except LoadgenError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
