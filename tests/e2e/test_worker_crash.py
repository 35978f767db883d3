"""A worker that dies fails only its in-flight request, and comes back."""

import os
import signal
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server, stop_server


@pytest.fixture(scope="module")
def crash_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("crash_repo")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name, folder in (("slow", "models"), ("add_sub", "../model_repository")):
        os.symlink(os.path.normpath(os.path.join(root, folder, name)), repo / name)
    srv = start_server(str(repo), str(tmp_path_factory.mktemp("crash_logs") / "log"),
                       wait_models=("slow", "add_sub"))
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
