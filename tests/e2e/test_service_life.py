"""The server's life as a service: systemd notifications, the drain at SIGTERM/SIGINT, and the
sweep of shared memory left by dead servers. Each test runs its own server: most of them stop it.

Models: `life_sleep` (one instance; sleeps SECONDS, and says when it started) and
`stream_probe` (decoupled; COUNT responses `delay_ms` apart), see tests/models.
"""

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import gevent
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from httpx_sse import connect_sse
from tritonclient.utils import InferenceServerException

from shmserve.ipc.segments import Segment, segment_name
from tests.conftest import (ROOT, STARTED_PIDS, alive, free_port, shm_entries, start_server,
                            stop_server)

WAIT_S = 20.0


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("life_repo")
    for name in ("life_sleep", "stream_probe"):
        os.symlink(os.path.join(ROOT, "tests", "models", name), path / name)
    return str(path)


@pytest.fixture
def launch(repo, tmp_path):
    """Starts a server on `repo` with extra flags; whatever is still running at the end stops."""
    started = []

    def go(*flags):
        srv = start_server(repo, str(tmp_path / f"server{len(started)}.log"), *flags,
                           wait_models=("life_sleep", "stream_probe"))
        started.append(srv)
        return srv

    yield go
    for srv in started:
        stop_server(srv)


def _status(server, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}{path}", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _sleep_inputs(seconds: float) -> list:
    tensor = httpclient.InferInput("SECONDS", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], np.float32))
    return [tensor]


def _grpc_sleep_inputs(seconds: float) -> list:
    tensor = grpcclient.InferInput("SECONDS", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], np.float32))
    return [tensor]


def _probe_inputs(count: int) -> list:
    tensor = grpcclient.InferInput("COUNT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([count], np.int32))
    return [tensor]


def _sleep_in_flight(server, seconds: float, marker: str):
    """An HTTP request to life_sleep, in flight once this returns: its pending result."""
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    pending = client.async_infer("life_sleep", _sleep_inputs(seconds),
                                 parameters={"started_to": marker})
    # The request is a greenlet of the client's: it is sent while this one sleeps in gevent
    # (async_infer itself yields for only 10 ms, too short on a loaded machine).
    _wait_for(lambda: os.path.exists(marker), "the model to start the request",
              pause=gevent.sleep)
    return client, pending


def _wait_for(condition, what: str, timeout: float = WAIT_S, pause=time.sleep) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        pause(0.02)


def _exits(server, timeout: float = WAIT_S) -> int:
    return server.process.wait(timeout)


def _own_segments(server) -> set:
    return {n for n in shm_entries() if n.startswith(f"shmserve.{server.process.pid}.")}


# -- systemd ------------------------------------------------------------------------------------

def test_systemd_ready_watchdog_and_stopping(repo, tmp_path, monkeypatch):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(WAIT_S)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # a ping every 0.1 s
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    server = start_server(repo, str(tmp_path / "log"))
    try:
        states = []
        while b"READY=1" not in states:
            states.append(sock.recv(4096))
        # READY=1 comes once every model is loaded and the endpoints answer.
        assert _status(server, "/v2/health/ready") == 200
        pings = states.count(b"WATCHDOG=1")
        deadline = time.monotonic() + WAIT_S
        while pings < 3 and time.monotonic() < deadline:
            if sock.recv(4096) == b"WATCHDOG=1":
                pings += 1
        assert pings >= 3
        server.process.send_signal(signal.SIGTERM)
        while sock.recv(4096) != b"STOPPING=1":
            pass
        assert _exits(server) == 0
    finally:
        stop_server(server)
        sock.close()
    assert set(states) <= {b"READY=1", b"WATCHDOG=1"}


# -- drain --------------------------------------------------------------------------------------

def _refused(server) -> bool:
    """A new connection to the HTTP port is refused."""
    try:
        socket.create_connection(("127.0.0.1", server.http_port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_sigterm_stops_as_triton_does(launch, tmp_path):
    """The ports close at once; an open HTTP connection is still served (not ready, yet
    inference works) until its client closes it; gRPC takes no new calls, not even on an open
    stream, while what was in flight finishes; the exit timeout counts down once."""
    server = launch("--exit-timeout-secs=60")
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    streamed: queue.Queue = queue.Queue()
    grpc.start_stream(callback=lambda result, error: streamed.put((result, error)))
    sse_events: list = []
    sse_started = threading.Event()

    def read_sse():
        with httpx.Client(timeout=60) as client:
            with connect_sse(client, "POST",
                             f"http://{server.http_url}/v2/models/stream_probe/generate_stream",
                             json={"COUNT": 10, "delay_ms": 300}) as events:
                for event in events.iter_sse():
                    sse_events.append(event.json())
                    sse_started.set()

    sse = threading.Thread(target=read_sse)
    sleeper, pending = _sleep_in_flight(server, 4.0, str(tmp_path / "started"))
    try:
        assert http.is_server_ready()  # the connection that stays open
        grpc.async_stream_infer("stream_probe", _probe_inputs(10),
                                parameters={"delay_ms": 300})
        first = streamed.get(timeout=WAIT_S)
        assert first[1] is None, first[1]
        sse.start()
        assert sse_started.wait(WAIT_S)

        server.process.send_signal(signal.SIGTERM)
        _wait_for(lambda: _refused(server), "the HTTP port to close", 5)
        # The open HTTP connection: live, not ready, and still served.
        assert http.is_server_live() and not http.is_server_ready()
        assert http.infer("life_sleep", _sleep_inputs(0)).as_numpy("SECONDS_OUT")[0] == 0.0
        with pytest.raises(InferenceServerException) as e:  # gRPC takes no new call
            grpc.infer("life_sleep", _grpc_sleep_inputs(0))
        assert e.value.status() == "StatusCode.UNAVAILABLE"
        grpc.async_stream_infer("stream_probe", _probe_inputs(1))  # a new request on the stream
        assert server.process.poll() is None

        # What was in flight completes.
        assert pending.get_result().as_numpy("SECONDS_OUT")[0] == 4.0
        sse.join(WAIT_S)
        assert [len(doc["OUT"]) for doc in sse_events] == [4] * 10
        got = [first] + [streamed.get(timeout=WAIT_S) for _ in range(10)]
        errors = [str(err) for _, err in got if err is not None]
        # The request sent on the stream after SIGTERM, and only it, in Triton's words.
        assert errors == ["GRPC server is shutting down and has stopped accepting new "
                          "requests."]
        results = [r for r, err in got if err is None]
        assert [int(r.as_numpy("OUT")[0]) for r in results] == list(range(10))
        grpc.stop_stream()
        time.sleep(1.5)
        assert server.process.poll() is None  # the HTTP connections are still open
        for client in (http, sleeper):
            client.close()
        assert _exits(server) == 0
    finally:
        grpc.stop_stream(cancel_requests=True)
        for client in (grpc, http, sleeper):
            client.close()
        if sse.is_alive():
            sse.join(WAIT_S)
    log = server.log()
    assert "SIGTERM received" in log and "shmserve stopped" in log
    # The three HTTP connections (two clients and the SSE stream), and the gRPC stream.
    first = [line for line in log.splitlines() if "] Timeout 60: " in line]
    # 4 when the server had yet to see the close of the connection _sleep_in_flight opens
    # and closes at once
    assert re.search(r"Timeout 60: Found [34] HTTP service connections", log), first
    assert "Timeout 60: Found 1 GRPC service connections and inference handlers" in log, first
    countdown = [int(n) for n in re.findall(r"\] Timeout (\d+): ", log)]
    assert countdown == sorted(countdown, reverse=True)  # one countdown, never restarted
    assert "Waiting for in-flight requests to complete." in log
    assert not _own_segments(server)


def test_second_signal_stops_waiting(launch, tmp_path):
    server = launch("--exit-timeout-secs=120")
    sleeper, pending = _sleep_in_flight(server, 60.0, str(tmp_path / "started"))
    try:
        server.process.send_signal(signal.SIGINT)
        _wait_for(lambda: _refused(server), "the HTTP port to close")
        time.sleep(0.5)
        assert server.process.poll() is None  # still waiting for the request
        started = time.monotonic()
        server.process.send_signal(signal.SIGINT)
        with pytest.raises(InferenceServerException) as e:
            pending.get_result()
        assert "model instance 'life_sleep_0_0'" in e.value.message()
        assert "server shut down" in e.value.message()
        assert _exits(server) == 0
        assert time.monotonic() - started < 10
    finally:
        sleeper.close()
    assert "SIGINT received again" in server.log()
    assert not _own_segments(server)


def test_exit_timeout_ends_the_drain(launch, tmp_path):
    server = launch("--exit-timeout-secs=1")
    sleeper, pending = _sleep_in_flight(server, 60.0, str(tmp_path / "started"))
    try:
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        with pytest.raises(InferenceServerException) as e:
            pending.get_result()
        assert "--exit-timeout-secs" in e.value.message()
        assert _exits(server) == 0
        assert time.monotonic() - started < 10
    finally:
        sleeper.close()
    assert not _own_segments(server)


# -- stale segments ----------------------------------------------------------------------------

def test_segments_of_dead_servers_are_removed_at_start(launch):
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert not alive(dead.pid)
    stale = segment_name(dead.pid, "life.stale.0")
    kept = segment_name(os.getpid(), "life.kept.0")  # a live process's, as another server's
    segments = [Segment.create(name, 4096) for name in (stale, kept)]
    try:
        for segment in segments:
            segment.close()
        server = launch()
        names = shm_entries()
        assert stale[1:] not in names
        assert kept[1:] in names
        assert "removed 1 shared-memory segment(s) of dead shmserve processes" in server.log()
    finally:
        for segment in segments:
            segment.unlink()  # a name already gone is fine


# -- --exit-on-error ---------------------------------------------------------------------------

def _start_and_wait_for_exit(args: list, log_path: str) -> tuple:
    """(exit code, log) of a server that is expected to give up while starting."""
    cmd = [sys.executable, "-m", "shmserve.cli", "--http-address", "127.0.0.1",
           "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
           "--http-port", str(free_port()), "--grpc-port", str(free_port()),
           "--metrics-port", str(free_port()), *args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    STARTED_PIDS.add(proc.pid)
    try:
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with open(log_path, errors="replace") as f:
        return code, f.read()


@pytest.mark.parametrize("args", [
    ["--model-control-mode=explicit", "--load-model=fault_init_raises", "--load-model=add_sub"],
    ["--model-control-mode=explicit", "--load-model=no_such_model"],
])
def test_a_model_that_fails_at_startup_stops_the_server_as_in_triton(test_repository, tmp_path,
                                                                     args):
    code, log = _start_and_wait_for_exit(["--model-repository", test_repository, *args],
                                         str(tmp_path / "shmserve.log"))
    assert code == 1, log
    assert "failed to load all models" in log
    assert "fault_init_raises" in log or "'no_such_model', failed to poll" in log


def test_a_model_in_two_repositories_at_startup_stops_the_server_as_in_triton(test_repository,
                                                                             tmp_path):
    other = tmp_path / "other_repository"
    other.mkdir()
    os.symlink(os.path.join(test_repository, "add_sub"), other / "add_sub")
    code, log = _start_and_wait_for_exit(
        ["--model-repository", test_repository, "--model-repository", str(other),
         "--model-control-mode=explicit", "--load-model=add_sub"],
        str(tmp_path / "shmserve.log"))
    assert code == 1, log
    assert "failed to poll model 'add_sub': not unique across all model repositories" in log
    assert "failed to load all models" in log


def test_exit_on_error_false_serves_the_models_that_loaded(test_repository, tmp_path):
    server = start_server(test_repository, str(tmp_path / "shmserve.log"),
                          "--model-control-mode=explicit", "--load-model=fault_init_raises",
                          "--load-model=add_sub", "--exit-on-error=false",
                          wait_models=("add_sub",))
    try:
        assert "failed to load 'fault_init_raises'" in server.log()
    finally:
        stop_server(server)


def _nice(pid: int) -> int:
    """The nice value of the thread whose id is `pid` (a process's main thread)."""
    return _nice_of(pid, pid)


def _nice_of(pid: int, tid) -> int:
    with open(f"/proc/{pid}/task/{tid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])


@pytest.mark.skipif(os.geteuid() != 0, reason="a nice value below the starting one needs root "
                                              "(CAP_SYS_NICE)")
def test_front_nice_moves_the_front_only_and_the_workers_keep_the_starting_value(launch):
    started = os.getpriority(os.PRIO_PROCESS, 0)
    srv = launch("--front-nice", str(started - 5))
    assert _nice(srv.process.pid) == started - 5
    children = [int(p) for p in subprocess.run(["pgrep", "-P", str(srv.process.pid)],
                                               capture_output=True, text=True).stdout.split()]
    # the two workers, and the shared-memory watchdog
    assert len(srv.workers()) == 2 and len(children) == 3
    threads = [(w, t) for w in children for t in os.listdir(f"/proc/{w}/task")]
    assert len(threads) > 3  # every thread: numpy's and the log's too
    assert {_nice_of(w, t) for w, t in threads} == {started}
    with httpclient.InferenceServerClient(srv.http_url) as client:  # it still serves
        assert client.infer("life_sleep", _sleep_inputs(0.0)) is not None
