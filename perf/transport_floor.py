"""The ceiling transports put on shmserve: echo servers with no model, no scheduler and no
worker, on shmserve's own gRPC layer and on the Python stacks it chose between, driven by the
same load generator.

    .venv/bin/python perf/transport_floor.py [--concurrency 1 32] [--port 18400]

Each server answers identity_fp32's ModelInfer (gRPC) or infer (HTTP, binary extension) by
echoing INPUT0 as OUTPUT0, which is all loadgen.py checks. If one of these cannot reach a
throughput, shmserve built on it cannot either, whatever the rest of the server does; compare
with Triton's figures from bench_identity.py taken on the same machine.
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from loadgen import run
from servers import tree_cpu_seconds

STACKS = {
    # name: (protocol, how the echo server runs)
    "shmserve's gRPC + uvloop": ("grpc", "shmserve"),
    "grpc.aio + uvloop": ("grpc", "grpc-aio"),
    "grpc sync, 8 threads": ("grpc", "grpc-sync"),
    "aiohttp + uvloop": ("http", "aiohttp"),
    "shmserve's HTTP/1.1 + uvloop": ("http", "shmserve-http"),
}

ECHO_SERVER = r'''
import json, sys
mode, port = sys.argv[1], int(sys.argv[2])
METHOD = "/inference.GRPCInferenceService/ModelInfer"

def grpc_echo(raw):
    from tritonclient.grpc import service_pb2
    req = service_pb2.ModelInferRequest.FromString(raw)
    out = service_pb2.ModelInferResponse(model_name=req.model_name, model_version="1", id=req.id)
    t = out.outputs.add(name="OUTPUT0", datatype="FP32")
    t.shape.extend(req.inputs[0].shape)
    out.raw_output_contents.append(req.raw_input_contents[0])
    return out.SerializeToString()

if mode.startswith("grpc"):
    import grpc
    class Handlers(grpc.GenericRpcHandler):
        def __init__(self, fn):
            self.handler = grpc.unary_unary_rpc_method_handler(fn)
        def service(self, details):
            return self.handler if details.method == METHOD else None
if mode == "grpc-sync":
    from concurrent.futures import ThreadPoolExecutor
    server = grpc.server(ThreadPoolExecutor(8))
    server.add_generic_rpc_handlers((Handlers(lambda raw, ctx: grpc_echo(raw)),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()
elif mode == "shmserve":
    import asyncio, uvloop
    from shmserve.grpc.transport import GrpcServer, Method
    async def main():
        async def echo(raw, call):
            return grpc_echo(raw)
        server = GrpcServer({METHOD: Method(echo, None, bytes, False)}, 2**31 - 1)
        await server.start("127.0.0.1", port)
        await asyncio.Event().wait()
    uvloop.run(main())
elif mode == "grpc-aio":
    import uvloop
    async def main():
        server = grpc.aio.server()
        async def echo(raw, ctx):
            return grpc_echo(raw)
        server.add_generic_rpc_handlers((Handlers(echo),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()
    uvloop.run(main())
elif mode == "shmserve-http":
    import asyncio, uvloop
    from shmserve.http.http1 import HttpServer
    from shmserve.http.http1_messages import Response
    async def main():
        async def infer(request):
            n = int(request.headers["inference-header-content-length"])
            body = request.body
            header, raw = json.loads(body[:n]), body[n:]
            out = json.dumps({"model_name": "identity_fp32", "model_version": "1", "outputs": [
                {"name": "OUTPUT0", "datatype": "FP32", "shape": header["inputs"][0]["shape"],
                 "parameters": {"binary_data_size": len(raw)}}]}).encode()
            return Response(200, out + raw, "application/octet-stream",
                            {"Inference-Header-Content-Length": str(len(out))})
        server = HttpServer(infer, 2**26)
        await server.start("127.0.0.1", port)
        await asyncio.Event().wait()
    uvloop.run(main())
else:
    import uvloop
    from aiohttp import web
    async def infer(request):
        body = await request.read()
        n = int(request.headers["Inference-Header-Content-Length"])
        header, raw = json.loads(body[:n]), body[n:]
        out = json.dumps({"model_name": "identity_fp32", "model_version": "1", "outputs": [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": header["inputs"][0]["shape"],
             "parameters": {"binary_data_size": len(raw)}}]}).encode()
        return web.Response(body=out + raw, content_type="application/octet-stream",
                            headers={"Inference-Header-Content-Length": str(len(out))})
    app = web.Application()
    app.router.add_post("/v2/models/{model}/infer", infer)
    web.run_app(app, host="127.0.0.1", port=port, loop=uvloop.new_event_loop(), print=None)
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--port", type=int, default=18400)
    args = ap.parse_args()
    rows = []
    for name, (protocol, mode) in STACKS.items():
        server = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, mode, str(args.port)])
        try:
            time.sleep(2.0)
            if server.poll() is not None:
                raise SystemExit(f"{name}: echo server exited with {server.returncode}")
            for c in args.concurrency:
                r = run(protocol, "127.0.0.1", args.port, c,
                        server_cpu=lambda server=server: tree_cpu_seconds(server.pid))
                rows.append((name, c, r))
                print(json.dumps({"stack": name, "concurrency": c, "infer_per_s": r.infer_per_s,
                                  "p50_ms": r.p50_ms, "p99_ms": r.p99_ms,
                                  "server_cpu_cores": r.server_cpu_cores}), file=sys.stderr)
        finally:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    print("| stack | conc | infer/s | p50 ms | p99 ms | server CPU cores | CPU µs per request |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, c, r in rows:
        per_request = r.server_cpu_cores / r.infer_per_s * 1e6 if r.infer_per_s else 0
        print(f"| {name} | {c} | {r.infer_per_s:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | "
              f"{r.server_cpu_cores:.2f} | {per_request:.0f} |")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
