"""Injected faults: workers killed mid-batch, mid-stream, while loading and while the server
shuts down; models that raise in `initialize` or leak; clients that vanish mid-request,
mid-stream, mid-SSE or with a region registered; /dev/shm out of space.

Each test checks the same four things: the targeted requests fail with an error naming the
instance and the cause, concurrent requests elsewhere all succeed, the server recovers (models
ready, new requests served), and nothing leaks (worker processes, the server's own segments,
client mappings).
"""

import asyncio
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import posix_ipc
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from shmserve.dispatch import instance_memory
from shmserve.host.server import Options, Server
from shmserve.inference import InferRequest, InputTensor, RequestedOutput
from tests.conftest import ROOT, SHM_DIR, alive, start_server, stop_server
from tests.e2e.streaming_helpers import metric, read_record, wait_record
from tests.e2e.test_worker_crash import _instance_pids

MODELS = ("batch_recorder", "stream_probe", "slow", "add_sub", "repeat", "fault_leak")
LOADED = MODELS + ("fault_init_raises",)
INSTANCE_FAILED = "Failed to process the request(s) for model instance"


def _repository(tmp_path_factory, names) -> str:
    repo = tmp_path_factory.mktemp("fault_repo")
    for name in names:
        for folder in ("tests/models", "model_repository"):
            path = os.path.join(ROOT, folder, name)
            if os.path.isdir(path):
                os.symlink(path, repo / name)
    return str(repo)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    repo = _repository(tmp_path_factory, LOADED + ("fault_slow_init",))
    server = start_server(repo, str(tmp_path_factory.mktemp("fault_logs") / "log"),
                          "--model-control-mode=explicit",
                          *(f"--load-model={m}" for m in LOADED), wait_models=MODELS)
    yield server
    stop_server(server)


@pytest.fixture
def http(srv):
    client = httpclient.InferenceServerClient(srv.http_url, concurrency=8)
    yield client
    client.close()


def _segments(pid: int) -> int:
    return sum(1 for n in os.listdir(SHM_DIR) if n.startswith(f"shmserve.{pid}."))


class Baseline:
    """Worker processes and server segments now; `recovered` waits until they are back."""

    def __init__(self, server, models=MODELS):
        self.server = server
        self.models = models
        self.workers = len(server.workers())
        self.segments = _segments(server.process.pid)
        self.tracebacks = server.log().count("Traceback")

    def recovered(self, http, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (all(http.is_model_ready(m) for m in self.models)
                    and len(self.server.workers()) == self.workers
                    and _segments(self.server.process.pid) == self.segments):
                break
            time.sleep(0.05)
        assert [m for m in self.models if not http.is_model_ready(m)] == []
        assert len(self.server.workers()) == self.workers
        assert _segments(self.server.process.pid) == self.segments
        assert self.server.log().count("Traceback") == self.tracebacks


def _input(cls, name, array):
    inp = cls.InferInput(name, list(array.shape),
                         {np.float32: "FP32", np.int32: "INT32", np.uint32: "UINT32"}[
                             array.dtype.type])
    inp.set_data_from_numpy(array)
    return inp


class Bystanders:
    """Requests to models the fault does not target, sent in a loop while it happens: every
    one must succeed."""

    def __init__(self, server):
        self._url = server.http_url
        self._stop = threading.Event()
        self.sent = 0
        self.errors: list = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        # tritonclient's HTTP client is gevent's: one per thread
        client = httpclient.InferenceServerClient(self._url)
        a = np.arange(4, dtype=np.float32)
        while not self._stop.is_set():
            self.sent += 1
            try:
                r = client.infer("add_sub", [_input(httpclient, "INPUT0", a),
                                                   _input(httpclient, "INPUT1", a)])
                assert list(r.as_numpy("OUTPUT0")) == list(a * 2)
            except Exception as exc:  # noqa: BLE001  (every failure is a lost request)
                self.errors.append(exc)
            time.sleep(0.02)
        client.close()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._stop.set()
        self._thread.join()
        assert self.errors == [] and self.sent > 0


def _kill_instance(server, instance: str) -> int:
    deadline = time.monotonic() + 10
    while instance not in (pids := _instance_pids(server)):
        assert time.monotonic() < deadline, f"no worker for {instance}"
        time.sleep(0.02)
    os.kill(pids[instance], signal.SIGKILL)
    return pids[instance]


# -- workers that die ------------------------------------------------------------------------

def test_worker_killed_mid_batch_fails_that_batch_only(srv, http, tmp_path):
    base = Baseline(srv)
    hold = tmp_path / "hold"
    results: dict = {}
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        with Bystanders(srv):
            for i in range(6):
                client.async_infer(
                    "batch_recorder",
                    [_input(grpcclient, "INPUT0", np.full((1, 2), i, np.float32))],
                    callback=lambda result, error, i=i: results.__setitem__(i, (result, error)),
                    parameters={"hold_until": str(hold)})
                time.sleep(0.05)
            time.sleep(0.3)  # a batch runs (held), the next waits in the worker, others queue
            _kill_instance(srv, "batch_recorder_0_0")
            time.sleep(0.2)
            hold.touch()
            deadline = time.monotonic() + 20
            while len(results) < 6 and time.monotonic() < deadline:
                time.sleep(0.05)
        failed = {i: e for i, (r, e) in results.items() if e is not None}
        served = {i: r for i, (r, e) in results.items() if e is None}
        assert len(failed) + len(served) == 6 and failed
        for e in failed.values():
            assert f"{INSTANCE_FAILED} 'batch_recorder_0_0', message: the instance's process " \
                   f"exited with code -9 (SIGKILL)" in e.message()
        # The first request ran alone on the idle instance: it is among the failed, and the
        # requests still queued in the batcher ran after the restart, batched.
        assert 0 in failed and served
        for i, r in served.items():
            assert r.as_numpy("OUTPUT0").tolist() == [[i, i]]
    finally:
        client.close()
    base.recovered(http)


def test_worker_killed_mid_stream_ends_that_stream_with_an_error(srv, http, tmp_path):
    base = Baseline(srv)
    record = str(tmp_path / "record")
    probe, other = [], []
    clients = [grpcclient.InferenceServerClient(srv.grpc_url) for _ in range(2)]
    try:
        with Bystanders(srv):
            clients[0].start_stream(callback=lambda result, error: probe.append((result, error)))
            clients[1].start_stream(callback=lambda result, error: other.append((result, error)))
            clients[0].async_stream_infer(
                "stream_probe", [_input(grpcclient, "COUNT", np.array([1000], np.int32))],
                parameters={"record_to": record, "delay_ms": 20})
            clients[1].async_stream_infer(
                "repeat", [_input(grpcclient, "IN", np.arange(20, dtype=np.int32)),
                           _input(grpcclient, "DELAY", np.full(20, 50, np.uint32))])
            while (read_record(record) or ("sent", 0))[1] < 5:
                time.sleep(0.01)
            _kill_instance(srv, "stream_probe_0_0")
            clients[1].stop_stream()  # waits for repeat's 20 responses
            deadline = time.monotonic() + 10
            while not [e for _, e in probe if e is not None] and time.monotonic() < deadline:
                time.sleep(0.02)
            clients[0].stop_stream()
        errors = [e for _, e in probe if e is not None]
        assert len(errors) == 1
        assert f"{INSTANCE_FAILED} 'stream_probe_0_0', message: the instance's process exited " \
               f"with code -9" in errors[0].message()
        assert 5 <= len(probe) - 1 < 1000
        assert [e for _, e in other if e is not None] == []
        assert [r.as_numpy("OUT")[0] for r, _ in other] == list(range(20))
    finally:
        for c in clients:
            c.close()
    base.recovered(http)
    with urllib.request.urlopen(urllib.request.Request(
            f"http://{srv.http_url}/v2/models/stream_probe/generate",
            data=json.dumps({"COUNT": 1}).encode()), timeout=10) as r:
        assert json.loads(r.read())["OUT"] == [0] * 4


def test_worker_killed_while_loading_fails_the_load_cleanly(srv, http):
    base = Baseline(srv)
    errors = []

    def load():
        client = httpclient.InferenceServerClient(srv.http_url)
        try:
            client.load_model("fault_slow_init")
        except InferenceServerException as exc:
            errors.append(exc)
        finally:
            client.close()

    before = srv.workers()
    with Bystanders(srv):
        loader = threading.Thread(target=load)
        loader.start()
        deadline = time.monotonic() + 10
        while not (new := srv.workers() - before) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # starting up, or in its 2 s initialize: loading either way
        os.kill(new.pop(), signal.SIGKILL)
        loader.join(20)
    # Defined behaviour: the load fails (no retry: a model that cannot load is UNAVAILABLE
    # until loaded again), saying which instance died and how.
    assert len(errors) == 1
    assert ("Stub process 'fault_slow_init_0_0' is not healthy. (model instance "
            "'fault_slow_init_0_0' exited with code -9 (SIGKILL) while loading"
            in errors[0].message())
    assert not http.is_model_ready("fault_slow_init")
    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert index["fault_slow_init"]["state"] == "UNAVAILABLE"
    assert "exited with code -9 (SIGKILL) while loading" in index["fault_slow_init"]["reason"]
    base.recovered(http)  # the dead worker's segments are gone, no worker left behind
    http.load_model("fault_slow_init")  # loading again works
    r = http.infer("fault_slow_init", [_input(httpclient, "INPUT0", np.ones(3, np.float32))])
    assert r.as_numpy("OUTPUT0").tolist() == [1, 1, 1]
    http.unload_model("fault_slow_init")
    base.recovered(http)


def test_sigterm_while_a_worker_is_killed_exits_cleanly(tmp_path_factory):
    repo = _repository(tmp_path_factory, ("slow", "add_sub"))
    server = start_server(repo, str(tmp_path_factory.mktemp("fault_stop") / "log"),
                          wait_models=("slow", "add_sub"))
    pid = server.process.pid
    results = []
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.async_infer("slow", [_input(grpcclient, "INPUT0", np.array([3.0], np.float32))],
                           callback=lambda result, error: results.append((result, error)))
        time.sleep(0.5)
        workers = _instance_pids(server)
        server.process.send_signal(signal.SIGTERM)  # drains: waits for the slow request
        time.sleep(0.2)
        for name in ("slow_0_0", "slow_0_1"):
            os.kill(workers[name], signal.SIGKILL)
        assert server.process.wait(15) == 0
        deadline = time.monotonic() + 5
        while not results and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        client.close()
        stop_server(server)
    assert len(results) == 1 and results[0][1] is not None
    assert INSTANCE_FAILED in results[0][1].message()
    assert not [p for p in workers.values() if alive(p)]
    assert _segments(pid) == 0
    assert "Traceback" not in server.log()


# -- models that fail ------------------------------------------------------------------------

def test_model_that_raises_in_initialize_is_unavailable_with_its_message(srv, http):
    base = Baseline(srv)
    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert index["fault_init_raises"]["state"] == "UNAVAILABLE"
    # Triton's words: the status, the Python error, the model's frame.
    head, frames = index["fault_init_raises"]["reason"].split("\n\nAt:\n")
    assert head == "Internal: RuntimeError: fault_init_raises refuses to initialize"
    assert frames.startswith("  /") and frames.endswith(
        os.path.join("fault_init_raises", "1", "model.py") + "(5): initialize\n")
    assert frames.count("\n") == 1
    with pytest.raises(InferenceServerException) as e:
        http.infer("fault_init_raises", [_input(httpclient, "INPUT0", np.ones(1, np.float32))])
    assert "fault_init_raises" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        http.load_model("fault_init_raises")  # again: same message, nothing left behind
    assert "fault_init_raises refuses to initialize" in e.value.message()
    base.tracebacks += 1  # the model's, logged again
    base.recovered(http)


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_leaking_model_grows_its_own_worker_only(srv, http):
    worker = _instance_pids(srv)["fault_leak_0_0"]
    worker_before, server_before = _rss_mb(worker), _rss_mb(srv.process.pid)
    for _ in range(10):
        r = http.infer("fault_leak", [_input(httpclient, "MB", np.array([4], np.int32))])
    assert r.as_numpy("HELD_MB")[0] >= 40
    assert _rss_mb(worker) - worker_before >= 35
    assert _rss_mb(srv.process.pid) - server_before < 15
    a = _input(httpclient, "INPUT0", np.ones(4, np.float32))
    b = _input(httpclient, "INPUT1", np.ones(4, np.float32))
    assert http.infer("add_sub", [a, b]).as_numpy("OUTPUT0").tolist() == [2, 2, 2, 2]


# -- clients that vanish ---------------------------------------------------------------------

def _raw_http(server, path: str, body: dict) -> socket.socket:
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.http_port))
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def _abort(sock: socket.socket) -> None:
    """Close with a reset, as the kernel does for a process that died."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()


def _pending(server, model: str) -> float:
    return metric(server, "nv_inference_pending_request_count", model)


def test_http_client_gone_mid_request_frees_the_instance(srv, http):
    base = Baseline(srv)
    body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.5]}]}
    socks = [_raw_http(srv, "/v2/models/slow/infer", body) for _ in range(2)]
    time.sleep(0.3)
    for s in socks:
        _abort(s)
    # Both instances finish their sleep, their answers go nowhere, and they take work again.
    deadline = time.monotonic() + 5
    while _pending(srv, "slow") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _pending(srv, "slow") == 0
    time.sleep(2.0)  # the aborted requests' 1.5 s sleeps end, with room for a slow machine
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    done = []
    started = time.monotonic()
    for _ in range(2):
        client.async_infer("slow", [_input(grpcclient, "INPUT0", np.array([1.0], np.float32))],
                           callback=lambda result, error: done.append(
                               (error, time.monotonic() - started)))
    while len(done) < 2 and time.monotonic() - started < 8:
        time.sleep(0.01)
    client.close()
    assert [e for e, _ in done] == [None, None]
    # Two instances free: in parallel (one after the other would take 2 s or more).
    assert max(t for _, t in done) < 1.9
    base.recovered(http)


def test_sse_client_gone_mid_stream_cancels_the_model(srv, http, tmp_path):
    base = Baseline(srv)
    record = str(tmp_path / "record")
    sock = _raw_http(srv, "/v2/models/stream_probe/generate_stream",
                     {"COUNT": 1000, "delay_ms": 20, "record_to": record})
    wait_record(record, "sent", within=5)
    sock.recv(4096)
    _abort(sock)
    _, k = wait_record(record, "cancelled", within=5)
    assert k < 1000
    base.recovered(http)


_GRPC_CLIENT = """
import sys, time
import numpy as np
import tritonclient.grpc as g
c = g.InferenceServerClient(sys.argv[1])
c.start_stream(callback=lambda result, error: None)
i = g.InferInput("COUNT", [1], "INT32")
i.set_data_from_numpy(np.array([1000], np.int32))
c.async_stream_infer("stream_probe", [i], parameters={"record_to": sys.argv[2], "delay_ms": 20})
time.sleep(60)
"""


def test_grpc_stream_client_killed_mid_stream_cancels_the_model(srv, http, tmp_path):
    base = Baseline(srv)
    record = str(tmp_path / "record")
    client = subprocess.Popen([sys.executable, "-c", _GRPC_CLIENT, srv.grpc_url, record])
    try:
        wait_record(record, "sent", within=15)
    finally:
        client.kill()
        client.wait()
    _, k = wait_record(record, "cancelled", within=5)
    assert k < 1000
    base.recovered(http)


_REGION_CLIENT = """
import sys
import numpy as np
import posix_ipc, mmap
import tritonclient.http as h
url, key, unlink = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
seg = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, size=32)
m = mmap.mmap(seg.fd, 32)
m[:16] = np.arange(4, dtype=np.float32).tobytes()
c = h.InferenceServerClient(url)
c.register_system_shared_memory("dying", key, 32)
a, b = h.InferInput("INPUT0", [4], "FP32"), h.InferInput("INPUT1", [4], "FP32")
a.set_shared_memory("dying", 16)
b.set_shared_memory("dying", 16)
assert c.infer("add_sub", [a, b]).as_numpy("OUTPUT0").tolist() == [0, 2, 4, 6]
if unlink:
    seg.unlink()
# exits without unregistering
"""


@pytest.mark.parametrize("unlinked", [True, False], ids=["unlinked", "left"])
def test_client_dies_with_a_registered_region(srv, http, unlinked):
    base = Baseline(srv)
    key = f"/fault_region_{os.getpid()}"
    try:
        subprocess.run([sys.executable, "-c", _REGION_CLIENT, srv.http_url, key,
                        "1" if unlinked else "0"], check=True, timeout=30)
        assert [r["name"] for r in http.get_system_shared_memory_status()] == ["dying"]
        # The worker that mapped it keeps a valid mapping, unlinked or not: requests that
        # name the region still work, and so do the others.
        a = httpclient.InferInput("INPUT0", [4], "FP32")
        a.set_shared_memory("dying", 16)
        b = _input(httpclient, "INPUT1", np.ones(4, np.float32))
        assert http.infer("add_sub", [a, b]).as_numpy("OUTPUT0").tolist() == [1, 2, 3, 4]
        worker = _instance_pids(srv)["add_sub_0_0"]
        assert key.strip("/") in _maps(worker)
        http.unregister_system_shared_memory("dying")
        assert http.get_system_shared_memory_status() == []
        deadline = time.monotonic() + 5
        while key.strip("/") in _maps(worker) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert key.strip("/") not in _maps(worker)
        assert key.strip("/") not in _maps(srv.process.pid)
    finally:
        if not unlinked:
            posix_ipc.unlink_shared_memory(key)
    base.recovered(http)


def _maps(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


# -- /dev/shm out of space (simulated: the machine's /dev/shm is shared) ---------------------

def test_no_space_for_arenas_makes_the_model_unavailable(tmp_path_factory, monkeypatch, caplog):
    repo = _repository(tmp_path_factory, ("add_sub", "identity_fp32"))
    full = {"identity_fp32"}
    real = instance_memory.new_segment

    def new_segment(tag, size):
        # the output arena comes second: the input arena made before it must not leak
        if any(tag.startswith(m + "_") for m in full) and tag.endswith(".out"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(tag, size)

    monkeypatch.setattr(instance_memory, "new_segment", new_segment)
    me = os.getpid()

    async def run():
        server = Server(Options(model_repository=[repo], allow_http=False, allow_grpc=False,
                                allow_metrics=False, exit_on_error=False))
        await server.start()
        try:
            assert _segments(me) == 4  # add_sub's input, output, BLS and request-table segments
            rec = server.registry.models["identity_fp32"]
            reason = rec.versions[1].reason
            assert reason == ("Unavailable: cannot start model instance 'identity_fp32_0_0': "
                              "cannot create its shared memory: [Errno 28] No space left on "
                              "device")
            assert (await _add_sub(server)) == [0, 2, 4, 6]
            # A restart that finds no space keeps retrying, and the model comes back once
            # there is room again.
            full.add("add_sub")
            pool = server.registry.models["add_sub"].versions[1].pool
            inst = pool.instances[0]
            os.kill(inst.pid, signal.SIGKILL)
            for _ in range(100):
                if "restart of 'add_sub_0_0' failed: cannot start" in caplog.text:
                    break
                await asyncio.sleep(0.05)
            assert not pool.all_alive and _segments(me) == 0
            full.clear()
            for _ in range(100):
                if pool.all_alive:
                    break
                await asyncio.sleep(0.05)
            assert (await _add_sub(server)) == [0, 2, 4, 6]
        finally:
            await server.stop()
        assert _segments(me) == 0

    asyncio.run(run())


async def _add_sub(server) -> list:
    a = np.arange(4, dtype=np.float32).tobytes()
    response = await server.infer(InferRequest("add_sub", inputs=[
        InputTensor("INPUT0", "FP32", [4], a), InputTensor("INPUT1", "FP32", [4], a)],
        outputs=[RequestedOutput("OUTPUT0")]))
    try:
        return np.frombuffer(response.outputs[0].data, np.float32).tolist()
    finally:
        response.done()


def test_full_arenas_fall_back_to_inline_transfer(tmp_path_factory, monkeypatch):
    """Tensors bigger than both arenas travel inside the frames: slower, still correct. So do
    tensors the arena has room for when /dev/shm has none: writing them into the sparse
    arena would be a SIGBUS, which kills the server instead of failing a request."""
    repo = _repository(tmp_path_factory, ("identity_fp32",))
    monkeypatch.setattr(instance_memory, "ARENA_BYTES", 1 << 20)
    refused = []

    def no_space(fd, offset, length):
        refused.append(length)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    async def run():
        server = Server(Options(model_repository=[repo], allow_http=False, allow_grpc=False,
                                allow_metrics=False))
        await server.start()
        try:
            big = np.arange(1 << 19, dtype=np.float32)  # 2 MiB: more than the arenas
            assert await _identity(server, big)
            monkeypatch.setattr(os, "posix_fallocate", no_space)  # here, not in the worker
            assert await _identity(server, big[:1 << 17])  # 512 KiB: fits the arena
            assert refused
        finally:
            await server.stop()

    asyncio.run(run())


async def _identity(server, data) -> bool:
    response = await server.infer(InferRequest("identity_fp32", inputs=[
        InputTensor("INPUT0", "FP32", [1, data.size], data.tobytes())]))
    try:
        return np.array_equal(np.frombuffer(response.outputs[0].data, np.float32), data)
    finally:
        response.done()
