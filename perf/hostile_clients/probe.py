"""The probe: a separate process (so that the attack's event loop cannot delay it) that sends a
normal request every 20 ms, a gRPC ModelInfer and an HTTP GET /v2/health/ready in turn on
connections opened before the attack, and the latencies of those that overlapped a window."""
import multiprocessing
import signal
import time

from .h2 import INFER
from .payloads import infer_request


STALL_MS = 100          # a normal request slower than this during an attack is a stall
PROBE_PERIOD_S = 0.020
PROBE_TIMEOUT_S = 5.0   # a probe request with no answer by then counts 5000 ms


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
