"""Shared fixtures: a real shmserve subprocess on free 127.0.0.1 ports, and leak checks."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families
import tritonclient.http as httpclient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHM_DIR = "/dev/shm"


def metric_samples(text: str) -> dict:
    """{(sample name, sorted labels): value} of Prometheus text, with the sample names as
    written: prometheus_client's parser renames a counter's samples `<family>_total`."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name
            if family.type == "counter" and name == family.name + "_total":
                name = family.name
            out[(name, tuple(sorted(s.labels.items())))] = s.value
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# PIDs of the servers this test session started (and its own, for in-process servers).
STARTED_PIDS = {os.getpid()}


def random_values(rng, dtype, shape):
    """Values of `dtype` spread over its whole range (bool, integers) or normal (floats)."""
    if dtype is np.bool_:
        return rng.random(shape) > 0.5
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


def run_sequences(client, lib, model: str, sequences: dict, input_name: str,
                  outputs: tuple) -> dict:
    """Send each sequence's INT32 values ({sequence id: [values]}) one request at a time,
    interleaving the sequences, and return {sequence id: [{output: array} per request]}."""
    got = {sequence_id: [] for sequence_id in sequences}
    longest = max(len(values) for values in sequences.values())
    for step in range(longest):
        for sequence_id, values in sequences.items():
            if step >= len(values):
                continue
            tensor = lib.InferInput(input_name, [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[values[step]]], np.int32))
            result = client.infer(model, [tensor], sequence_id=sequence_id,
                                  sequence_start=step == 0,
                                  sequence_end=step == len(values) - 1)
            got[sequence_id].append({name: result.as_numpy(name) for name in outputs})
    return got


def shm_entries() -> set:
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith("shmserve.")}
    except FileNotFoundError:
        return set()


def children_of(pid: int) -> set:
    out = set()
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out.update(int(x) for x in f.read().split())
    except OSError:
        pass
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@dataclass
class RunningServer:
    process: subprocess.Popen
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: str

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def children(self) -> set:
        """Every process the server started: its workers and its shared-memory watchdog."""
        return children_of(self.process.pid)

    def workers(self) -> set:
        return {p for p in self.children() if not is_watchdog(p)}


def is_watchdog(pid: int) -> bool:
    """Whether `pid` runs the server's shared-memory watchdog (workers/front_watch.py)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"workers.front_watch" in f.read().split(b"\0")
    except OSError:
        return False


def start_server(repo: str, log_path: str, *extra, wait_models=(), timeout=60.0) -> RunningServer:
    # A port free_port() found may be taken before the server binds it (the kernel hands the
    # same ephemeral range to the clients' outgoing connections): start again on others.
    for attempt in range(3):
        try:
            return _start_server(repo, log_path, *extra, wait_models=wait_models, timeout=timeout)
        except PortTaken:
            if attempt == 2:
                raise


class PortTaken(RuntimeError):
    pass


def _start_server(repo: str, log_path: str, *extra, wait_models, timeout) -> RunningServer:
    ports = [free_port() for _ in range(3)]
    cmd = [sys.executable, "-m", "shmserve.cli", "--model-repository", repo,
           "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
           "--metrics-address", "127.0.0.1", "--http-port", str(ports[0]),
           "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]),
           # The test repository holds models that fail on purpose (bad_config, ...).
           "--exit-on-error=false",
           # As the README's serve command: zero-copy clients are what shmserve is for.
           "--allow-client-shm=true", *extra]
    log = open(log_path, "wb")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    STARTED_PIDS.add(proc.pid)
    log.close()
    server = RunningServer(proc, *ports, log_path)
    deadline = time.monotonic() + timeout
    pending = list(wait_models)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = server.log()
            error = PortTaken if "address already in use" in text else RuntimeError
            raise error(f"shmserve exited with {proc.returncode}:\n{text}")
        try:
            urllib.request.urlopen(f"http://{server.http_url}/v2/health/live", timeout=1)
            while pending:
                urllib.request.urlopen(
                    f"http://{server.http_url}/v2/models/{pending[0]}/ready", timeout=1)
                pending.pop(0)
            return server
        except OSError:
            time.sleep(0.1)
    stop_server(server)
    raise RuntimeError(f"shmserve did not become ready:\n{server.log()}")


def wait_for_models(server: RunningServer, models, timeout: float = 60.0) -> None:
    """Until every one of `models` answers ready (their instances load in the background)."""
    deadline = time.monotonic() + timeout
    pending = list(models)
    while pending:
        try:
            urllib.request.urlopen(f"http://{server.http_url}/v2/models/{pending[0]}/ready",
                                   timeout=1)
            pending.pop(0)
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"models not ready: {pending}\n{server.log()}") from None
            time.sleep(0.1)


def stop_server(server: RunningServer, timeout: float = 30.0) -> None:
    """SIGTERM the server we started (by its PID) and check it took its workers (and its
    watchdog) along."""
    workers = server.children()
    proc = server.process
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            for pid in workers:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"shmserve did not stop on SIGTERM:\n{server.log()}") from None
    deadline = time.monotonic() + 10
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in workers if alive(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"worker processes outlived the server: {left}"


@pytest.fixture(scope="session")
def test_repository(tmp_path_factory) -> str:
    """The bundled examples and the test models, side by side in one repository."""
    repo = tmp_path_factory.mktemp("repository")
    for folder in ("model_repository", os.path.join("tests", "models")):
        base = os.path.join(ROOT, folder)
        for name in sorted(os.listdir(base)):
            path = os.path.join(base, name)
            if os.path.isdir(path) and not name.startswith((".", "_")):
                os.symlink(path, repo / name)
    return str(repo)


@pytest.fixture(scope="session")
def server(test_repository, tmp_path_factory):
    log_path = str(tmp_path_factory.mktemp("logs") / "shmserve.log")
    srv = start_server(test_repository, log_path,
                       wait_models=("add_sub", "identity_fp32", "string_echo", "echo_all"))
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def clients(server):
    """A tritonclient HTTP and gRPC client of the session's server, by protocol name."""
    made = {"http": httpclient.InferenceServerClient(server.http_url),
            "grpc": grpcclient.InferenceServerClient(server.grpc_url)}
    yield made
    for c in made.values():
        c.close()


@pytest.fixture(scope="session", autouse=True)
def no_leaked_segments():
    before = shm_entries()
    yield
    # Another test run on the machine may hold segments right now: only those of servers this
    # session started, or of processes that are gone, count as leaked.
    leaked = [n for n in shm_entries() - before
              if int(n.split(".")[1]) in STARTED_PIDS or not alive(int(n.split(".")[1]))]
    assert not leaked, f"shared-memory segments left behind: {sorted(leaked)}"


_E2E = Path(__file__).resolve().parent / "e2e"


def pytest_collection_modifyitems(config, items):
    """Everything under tests/e2e/ talks to a real server process: it is marked `e2e`, so that
    `pytest -m "not e2e"` runs the unit tests only."""
    for item in items:
        if item.path.is_relative_to(_E2E):
            item.add_marker(pytest.mark.e2e)
