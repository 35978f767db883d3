"""A worker that dies, or hangs past --model-instance-timeout-secs, fails only its in-flight
requests, comes back, and its model is not ready meanwhile."""

import os
import queue
import re
import signal
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, start_server, stop_server

# Among the longest modules of the suite (pytest --durations): -m "not slow" skips it.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def crash_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("crash_repo")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name, folder in (("slow", "models"), ("add_sub", "../model_repository")):
        os.symlink(os.path.normpath(os.path.join(root, folder, name)), repo / name)
    srv = start_server(str(repo), str(tmp_path_factory.mktemp("crash_logs") / "log"),
                       "--log-verbose=1", wait_models=("slow", "add_sub"))
    yield srv
    stop_server(srv)


def _slow_input(seconds):
    inp = grpcclient.InferInput("INPUT0", [1], "FP32")
    inp.set_data_from_numpy(np.array([seconds], np.float32))
    return inp


def _worker_pids(server):
    pids = server.workers()
    assert pids, "no worker processes found"
    return pids


def test_killed_worker_fails_its_request_and_restarts(crash_server):
    client = grpcclient.InferenceServerClient(crash_server.grpc_url)
    http = httpclient.InferenceServerClient(crash_server.http_url)
    try:
        results = []
        client.async_infer("slow", [_slow_input(5.0)], callback=lambda result, error: results.append((result, error)))
        client.async_infer("slow", [_slow_input(5.0)], callback=lambda result, error: results.append((result, error)))
        time.sleep(1.0)  # both instances are now busy sleeping
        before = _worker_pids(crash_server)
        busy = [p for p in before if _cmd_is_worker(p)]
        victim = busy[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while len(results) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        errors = [e for _, e in results if e is not None]
        oks = [r for r, e in results if e is None]
        # Only the request on the killed instance fails; the killed instance might be
        # either `slow` one, or (if unlucky) add_sub's, which had nothing in flight.
        assert len(errors) <= 1 and len(errors) + len(oks) == 2
        for e in errors:
            assert isinstance(e, InferenceServerException)
            assert "Failed to process the request(s) for model instance" in e.message()
        # It comes back, and the model serves again.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if len(_worker_pids(crash_server)) == len(before) and http.is_model_ready("slow") \
                    and http.is_model_ready("add_sub"):
                break
            time.sleep(0.1)
        assert victim not in _worker_pids(crash_server)
        assert len(_worker_pids(crash_server)) == len(before)
        r = client.infer("slow", [_slow_input(0.0)])
        assert r.as_numpy("OUTPUT0")[0] == 0.0
        assert "died; restarting" in crash_server.log()
    finally:
        client.close()
        http.close()


def _cmd_is_worker(pid) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"workers" in f.read()
    except OSError:
        return False


def _instance_pids(server) -> dict:
    """instance name -> pid of its worker, from the arenas each worker maps."""
    out = {}
    for pid in server.workers():
        try:
            with open(f"/proc/{pid}/maps") as f:
                found = re.search(rf"shmserve\.{server.process.pid}\.(\w+)\.in\.", f.read())
        except OSError:
            continue
        if found:
            out[found.group(1)] = pid
    return out


def test_model_is_not_ready_while_one_of_its_instances_restarts(crash_server):
    client = grpcclient.InferenceServerClient(crash_server.grpc_url)
    http = httpclient.InferenceServerClient(crash_server.http_url)
    try:
        pids = _instance_pids(crash_server)
        victim = pids["slow_0_0"]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while http.is_model_ready("slow") and time.monotonic() < deadline:
            time.sleep(0.01)
        # Restarting (after a backoff of 0.5 s at least): not ready, strict server readiness
        # follows, yet the instance still alive serves.
        assert not http.is_model_ready("slow") and not client.is_model_ready("slow")
        assert not http.is_server_ready()
        # Triton's verbose line, which its tests count.
        assert ("Model 'slow' version 1 is not ready: Stub process 'slow_0_0' is not healthy."
                in crash_server.log())
        assert client.infer("slow", [_slow_input(0.0)]).as_numpy("OUTPUT0")[0] == 0.0
        deadline = time.monotonic() + 20
        while not http.is_model_ready("slow") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert http.is_model_ready("slow") and http.is_server_ready()
        assert _instance_pids(crash_server)["slow_0_0"] != victim
    finally:
        client.close()
        http.close()


@pytest.fixture(scope="module")
def hang_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("hang_repo")
    for name in ("life_sleep", "stream_probe"):
        os.symlink(os.path.join(ROOT, "tests", "models", name), repo / name)
    srv = start_server(str(repo), str(tmp_path_factory.mktemp("hang_logs") / "log"),
                       "--model-instance-timeout-secs=1",
                       wait_models=("life_sleep", "stream_probe"))
    yield srv
    stop_server(srv)


def _sleep_input(seconds):
    inp = grpcclient.InferInput("SECONDS", [1], "FP32")
    inp.set_data_from_numpy(np.array([seconds], np.float32))
    return inp


def test_hung_instance_is_killed_its_request_fails_and_it_comes_back(hang_server):
    client = grpcclient.InferenceServerClient(hang_server.grpc_url)
    http = httpclient.InferenceServerClient(hang_server.http_url)
    try:
        before = _instance_pids(hang_server)["life_sleep_0_0"]
        # Work shorter than the timeout is no hang.
        assert client.infer("life_sleep", [_sleep_input(0.5)]).as_numpy("SECONDS_OUT")[0] == 0.5
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as e:
            client.infer("life_sleep", [_sleep_input(60.0)])
        assert time.monotonic() - started < 15
        assert e.value.status() == "StatusCode.INTERNAL"
        assert ("Failed to process the request(s) for model instance 'life_sleep_0_0', message: "
                "the instance's process stopped answering within 1 s") in e.value.message()
        # Its only instance is restarting: not ready, and requests are UNAVAILABLE meanwhile.
        assert not http.is_model_ready("life_sleep")
        with pytest.raises(InferenceServerException) as e:
            client.infer("life_sleep", [_sleep_input(0.0)])
        assert e.value.status() == "StatusCode.UNAVAILABLE"
        deadline = time.monotonic() + 20
        while not http.is_model_ready("life_sleep") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert http.is_model_ready("life_sleep")
        assert _instance_pids(hang_server)["life_sleep_0_0"] != before
        assert client.infer("life_sleep", [_sleep_input(0.0)]).as_numpy("SECONDS_OUT")[0] == 0.0
        assert "sent nothing for 1 s" in hang_server.log()
    finally:
        client.close()
        http.close()


def test_a_stream_that_keeps_sending_is_not_hung(hang_server):
    """Each response pushes the deadline back: 3 s of responses 0.3 s apart outlast 1 s."""
    client = grpcclient.InferenceServerClient(hang_server.grpc_url)
    got = []
    try:
        client.start_stream(callback=lambda result, error: got.append((result, error)))
        count = grpcclient.InferInput("COUNT", [1], "INT32")
        count.set_data_from_numpy(np.array([10], np.int32))
        pid = _instance_pids(hang_server)["stream_probe_0_0"]
        client.async_stream_infer("stream_probe", [count], parameters={"delay_ms": 300})
        client.stop_stream()  # waits until the server ended the call
        assert [e for _, e in got if e is not None] == []
        assert len(got) == 10
        assert _instance_pids(hang_server)["stream_probe_0_0"] == pid
    finally:
        client.close()


def test_a_stream_held_back_by_its_reader_is_not_hung(hang_server, tmp_path):
    """A model waiting for a slow client to read sends nothing, yet is not hung."""
    client = grpcclient.InferenceServerClient(hang_server.grpc_url)
    gate = threading.Event()
    got: queue.Queue = queue.Queue()

    def read(result, error):
        got.put((result, error))
        gate.wait()  # the client reads nothing more until the gate opens

    record = str(tmp_path / "record")
    try:
        client.start_stream(callback=read)
        inputs = [grpcclient.InferInput("COUNT", [1], "INT32"),
                  grpcclient.InferInput("SIZE", [1], "INT32")]
        inputs[0].set_data_from_numpy(np.array([100], np.int32))
        inputs[1].set_data_from_numpy(np.array([1 << 20], np.int32))
        pid = _instance_pids(hang_server)["stream_probe_0_0"]
        client.async_stream_infer("stream_probe", inputs, parameters={"record_to": record})
        assert got.get(timeout=10)[1] is None
        time.sleep(3.0)  # three times the timeout, the model held back all along
        with open(record) as f:
            what, sent = f.read().split()
        assert what == "sent" and int(sent) < 100
        gate.set()
        client.stop_stream()
        items = [got.get_nowait() for _ in range(got.qsize())]
        assert [e for _, e in items if e is not None] == []
        assert len(items) == 99
        assert _instance_pids(hang_server)["stream_probe_0_0"] == pid
    finally:
        gate.set()
        client.close()
