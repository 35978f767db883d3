"""A front killed with SIGKILL leaves no shared memory and no process behind, as Triton leaves
none: its workers (even one in the middle of a long execute()) and its watchdog unlink every
/dev/shm segment named for it and exit within moments (workers/front_watch.py). A client's
own registered region stays. Each test runs its own server and kills it by its pid.

Models: `identity_fp32` (large tensors go through the arenas), `life_sleep` (one instance;
sleeps SECONDS and says when it started), `slow` (two instances; sleeps INPUT0[0] seconds),
`fault_slow_init` (initialize() takes 2 s), see tests/models.
"""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as client_shm

from tests.conftest import (ROOT, STARTED_PIDS, alive, children_of, free_port, is_watchdog,
                            start_server, stop_server)

# How long the segments and processes of a killed front may outlive it.
CLEANUP_S = 5.0
LARGE = 64 * 1024  # elements: 256 KiB tensors, above the inline threshold, go through arenas


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("front_killed_repo")
    for folder, name in (("model_repository", "identity_fp32"), ("tests/models", "life_sleep"),
                         ("tests/models", "slow")):
        os.symlink(os.path.join(ROOT, folder, name), path / name)
    return str(path)


@pytest.fixture
def cleanup():
    """Servers and pids the test started: whatever still runs at the end is killed by pid
    (resumed first, should the test have stopped it)."""
    servers, pids = [], []
    yield servers, pids
    for server in servers:
        pids.extend(server.children())
        stop_server(server)
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)


def _segments(front_pid: int) -> list:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"shmserve.{front_pid}."))


def _until(check, timeout: float = CLEANUP_S) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _use_the_arenas(server, region_key: str) -> None:
    """Large tensors both ways over HTTP and gRPC, and an input in a client's region."""
    data = np.arange(LARGE, dtype=np.float32)
    for module, url in ((httpclient, server.http_url), (grpcclient, server.grpc_url)):
        client = module.InferenceServerClient(url)
        try:
            inp = module.InferInput("INPUT0", [1, LARGE], "FP32")
            inp.set_data_from_numpy(data[None])
            result = client.infer("identity_fp32", [inp])
            assert np.array_equal(result.as_numpy("OUTPUT0")[0], data)
        finally:
            client.close()
    http = httpclient.InferenceServerClient(server.http_url)
    try:
        http.register_system_shared_memory("client_region", region_key, data.nbytes)
        inp = httpclient.InferInput("INPUT0", [1, LARGE], "FP32")
        inp.set_shared_memory("client_region", data.nbytes)
        assert np.array_equal(http.infer("identity_fp32", [inp]).as_numpy("OUTPUT0")[0], data)
    finally:
        http.close()


def _sleep_in(client, model: str, name: str, seconds: float, started_to=None) -> None:
    """Send a request that keeps an instance of `model` in execute() for `seconds`; its
    answer never comes (the front dies), and the client's error is ignored."""
    inp = grpcclient.InferInput(name, [1], "FP32")
    inp.set_data_from_numpy(np.array([seconds], np.float32))
    params = {"started_to": started_to} if started_to else None
    client.async_infer(model, [inp], callback=lambda result, error: None, parameters=params)


def _kill_front_and_check(server, children: set, region_key: str) -> None:
    front = server.process.pid
    assert _segments(front), "the server made no segments to clean up"
    os.kill(front, signal.SIGKILL)
    server.process.wait()
    assert _until(lambda: not _segments(front)), _segments(front)
    assert _until(lambda: not any(alive(p) for p in children)), \
        [p for p in children if alive(p)]
    # The client's region is the client's: still there.
    assert os.path.exists("/dev/shm/" + region_key.lstrip("/"))


@pytest.fixture
def client_region():
    key = f"/shmtest_front_killed_{os.getpid()}"
    handle = client_shm.create_shared_memory_region("client_region", key, LARGE * 4)
    client_shm.set_shared_memory_region(handle, [np.arange(LARGE, dtype=np.float32)])
    yield key
    client_shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy_in_execute"])
def test_killed_front_leaves_no_segment_and_no_process(repo, tmp_path, cleanup, client_region,
                                                       busy):
    servers, _ = cleanup
    server = start_server(repo, str(tmp_path / "server.log"),
                          wait_models=("identity_fp32", "life_sleep", "slow"))
    servers.append(server)
    _use_the_arenas(server, client_region)
    sleeper = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        if busy:  # every instance but identity_fp32's is in a 60 s execute() when it dies
            started = tmp_path / "started"
            _sleep_in(sleeper, "life_sleep", "SECONDS", 60.0, str(started))
            _sleep_in(sleeper, "slow", "INPUT0", 60.0)
            _sleep_in(sleeper, "slow", "INPUT0", 60.0)
            assert _until(started.exists, 20)
            time.sleep(0.5)  # slow's two instances are asleep too by now
        children = server.children()
        assert len([p for p in children if is_watchdog(p)]) == 1
        assert len(children) == 5  # four instances and the watchdog
        killed_at = time.monotonic()
        _kill_front_and_check(server, children, client_region)
        assert time.monotonic() - killed_at < CLEANUP_S
    finally:
        sleeper.close()


def _stop_and_kill(server, stopped: list, children: set) -> None:
    """SIGSTOP `stopped`, then kill the front: only the other children can clean up; then
    let the stopped ones go on, and check that everything ends."""
    front = server.process.pid
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        os.kill(front, signal.SIGKILL)
        server.process.wait()
        assert _until(lambda: not _segments(front)), _segments(front)
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    assert _until(lambda: not any(alive(p) for p in children)), \
        [p for p in children if alive(p)]


def test_watchdog_cleans_up_when_no_worker_can(repo, tmp_path, cleanup):
    # As for a front killed while it has no worker running (creating the first one's arenas,
    # restarting its only one): the workers are stopped, the watchdog alone unlinks.
    servers, pids = cleanup
    server = start_server(repo, str(tmp_path / "server.log"),
                          wait_models=("identity_fp32", "life_sleep", "slow"))
    servers.append(server)
    children = server.children()
    pids.extend(children)
    workers = [p for p in children if not is_watchdog(p)]
    _stop_and_kill(server, workers, children)
    assert "exited without stopping: removed its 16 shared-memory segment(s)" in server.log()


def test_workers_clean_up_without_the_watchdog(repo, tmp_path, cleanup):
    servers, pids = cleanup
    server = start_server(repo, str(tmp_path / "server.log"),
                          wait_models=("identity_fp32", "life_sleep", "slow"))
    servers.append(server)
    children = server.children()
    pids.extend(children)
    _stop_and_kill(server, [p for p in children if is_watchdog(p)], children)
    assert "exited without stopping" not in server.log()  # nothing was left to the watchdog


def test_front_killed_while_a_model_loads(test_repository, tmp_path, cleanup):
    # The only worker is in its model's 2 s initialize() when the front dies.
    _, pids = cleanup
    ports = [str(free_port()) for _ in range(3)]
    cmd = [sys.executable, "-m", "shmserve.cli", "--model-repository", test_repository,
           "--model-control-mode=explicit", "--load-model=fault_slow_init",
           "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
           "--metrics-address", "127.0.0.1", "--http-port", ports[0], "--grpc-port", ports[1],
           "--metrics-port", ports[2]]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(tmp_path / "server.log", "wb") as log:
        front = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    STARTED_PIDS.add(front.pid)
    pids.append(front.pid)
    try:
        assert _until(lambda: len(_segments(front.pid)) == 4
                      and len(children_of(front.pid)) == 2, 30), _segments(front.pid)
        time.sleep(0.5)  # in initialize() by now
        children = children_of(front.pid)
        pids.extend(children)
        assert front.poll() is None
        front.kill()
        front.wait()
        assert _until(lambda: not _segments(front.pid)), _segments(front.pid)
        assert _until(lambda: not any(alive(p) for p in children))
    finally:
        if front.poll() is None:
            front.kill()
            front.wait()
