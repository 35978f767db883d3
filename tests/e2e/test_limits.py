"""The limits of a server on a network (docs/limits.md), over HTTP and gRPC, against a
server started with small limits: each refusal is clear, and the server keeps serving.

Timing is only bounded from above, generously (a loaded 2-core machine must not flake).
"""

import gzip
import http.client
import json
import os
import socket
import statistics
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, start_server, stop_server

MAX_INPUT = 64 * 1024
MAX_TENSOR = 16 * 1024
PER_CONNECTION = 4
OPEN_STREAMS = 3
QUEUE = 4
SLOW_S = 0.5  # the slow model's execution time in the overload test
WAIT_S = 10.0
RETRY_S = 0.05  # a refused client's pause: offered load stays many times capacity


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    repo = tmp_path_factory.mktemp("limits_repo")
    for name, folder in (("slow", "tests/models"), ("identity_fp32", "model_repository"),
                         ("repeat", "model_repository")):
        os.symlink(os.path.join(ROOT, folder, name), repo / name)
    log_path = str(tmp_path_factory.mktemp("limits_logs") / "shmserve.log")
    srv = start_server(str(repo), log_path, f"--http-max-input-size={MAX_INPUT}",
                       f"--grpc-max-message-size={MAX_INPUT}",
                       f"--max-tensor-byte-size={MAX_TENSOR}",
                       f"--max-inflight-per-connection={PER_CONNECTION}",
                       f"--max-open-streams={OPEN_STREAMS}",
                       f"--max-queue-size-default={QUEUE}", "--allow-metrics=false",
                       wait_models=("slow", "identity_fp32", "repeat"))
    yield srv
    stop_server(srv)


def post(server, path: str, body: bytes, headers=None):
    conn = http.client.HTTPConnection(server.http_url, timeout=WAIT_S)
    try:
        conn.request("POST", path, body, headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def slow_body(seconds: float) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32",
                                   "data": [seconds]}]}).encode()


def identity_body(elements: int) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, elements],
                                   "datatype": "FP32", "data": [0.0] * elements}]}).encode()


def assert_serves(server):
    """A normal request succeeds over both protocols."""
    status, body = post(server, "/v2/models/identity_fp32/infer", identity_body(4))
    assert status == 200, body
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        result = client.infer("identity_fp32", [tensor])
        assert result.as_numpy("OUTPUT0").tolist() == [[1, 1, 1, 1]]


# -- sizes -----------------------------------------------------------------------------------

def test_http_body_over_the_max_input_size_is_refused(limited):
    status, body = post(limited, "/v2/models/identity_fp32/infer", b"{" + b" " * MAX_INPUT + b"}")
    assert status == 400
    assert "--http-max-input-size" in json.loads(body)["error"]
    # Small on the wire, too large once inflated.
    status, body = post(limited, "/v2/models/identity_fp32/infer",
                        gzip.compress(identity_body(MAX_INPUT // 2)),
                        {"Content-Encoding": "gzip"})
    assert status == 400
    assert "exceeds the maximum input size" in json.loads(body)["error"]
    # The JSON APIs read their bodies under the same limit.
    status, body = post(limited, "/v2/repository/index", b"{" + b" " * MAX_INPUT + b"}")
    assert status == 400 and "--http-max-input-size" in json.loads(body)["error"]
    assert_serves(limited)


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_grpc_message_over_the_max_message_size_is_refused(limited, compression):
    """Compressed, the message is far below the limit: its decompressed size counts."""
    with grpcclient.InferenceServerClient(limited.grpc_url) as client:
        tensor = grpcclient.InferInput("INPUT0", [1, MAX_INPUT // 4 + 16], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, MAX_INPUT // 4 + 16), np.float32))
        with pytest.raises(InferenceServerException) as e:
            client.infer("identity_fp32", [tensor], compression_algorithm=compression)
        assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert_serves(limited)


def test_a_tensor_over_the_max_tensor_byte_size_is_refused(limited):
    elements = MAX_TENSOR // 4 + 1  # within both message limits
    status, body = post(limited, "/v2/models/identity_fp32/infer", identity_body(elements))
    assert status == 400
    assert "--max-tensor-byte-size" in json.loads(body)["error"]
    with grpcclient.InferenceServerClient(limited.grpc_url) as client:
        tensor = grpcclient.InferInput("INPUT0", [1, elements], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, elements), np.float32))
        with pytest.raises(InferenceServerException) as e:
            client.infer("identity_fp32", [tensor])
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "--max-tensor-byte-size" in e.value.message()
    # A shape that claims far more than the bytes sent is refused by the limit first.
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 10**12], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 4}}]}).encode()
    status, body = post(limited, "/v2/models/identity_fp32/infer", header + b"\0" * 4,
                        {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400 and "--max-tensor-byte-size" in json.loads(body)["error"], body
    assert_serves(limited)


# -- requests in flight ------------------------------------------------------------------------

def read_response(f) -> tuple:
    """(status, body) of the next HTTP/1.1 response on a socket file."""
    status = int(f.readline().split()[1])
    length = 0
    while (line := f.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return status, f.read(length)


def test_http_pipelining_beyond_the_per_connection_cap_is_answered_in_order(limited):
    """The connection is not read while more than the cap wait; every request is answered,
    in its turn."""
    count = 50 * PER_CONNECTION
    requests = b""
    for i in range(count):
        body = slow_body(i * 1e-6)
        requests += (f"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    with socket.create_connection(("127.0.0.1", limited.http_port), timeout=WAIT_S) as sock:
        sock.sendall(requests)
        f = sock.makefile("rb")
        answers = [read_response(f) for _ in range(count)]
    assert [s for s, _ in answers] == [200] * count
    assert [json.loads(b)["outputs"][0]["data"][0] for _, b in answers] == pytest.approx(
        [i * 1e-6 for i in range(count)])
    assert_serves(limited)


def test_grpc_stream_over_the_inflight_cap_gets_unavailable(limited):
    results = []
    done = threading.Event()
    sent = 3 * PER_CONNECTION

    def callback(result, error):
        results.append(error)
        if len(results) == sent:
            done.set()

    with grpcclient.InferenceServerClient(limited.grpc_url) as client:
        client.start_stream(callback)
        for i in range(sent):
            tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
            tensor.set_data_from_numpy(np.array([0.3], np.float32))
            client.async_stream_infer("slow", [tensor], request_id=str(i))
        assert done.wait(WAIT_S)
        client.stop_stream()
    # Answers leave in request order, so rejections wait behind the requests being served,
    # and the stream is read on once they have left: later requests may be served again.
    errors = [e for e in results if e is not None]
    assert 1 <= len(errors) <= sent - PER_CONNECTION
    assert len(results) - len(errors) >= PER_CONNECTION
    assert all("--max-inflight-per-connection" in e.message() for e in errors)
    assert_serves(limited)


def test_streams_over_the_open_stream_cap_are_refused(limited):
    clients = [grpcclient.InferenceServerClient(limited.grpc_url)
               for _ in range(OPEN_STREAMS + 1)]
    try:
        def open_stream(client) -> list:
            answers = []
            event = threading.Event()
            client.start_stream(lambda result, error: (answers.append(error), event.set()))
            tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
            tensor.set_data_from_numpy(np.array([0.0], np.float32))
            try:
                client.async_stream_infer("slow", [tensor])
            except InferenceServerException:
                pass  # the server ended the stream already: why went to the callback
            assert event.wait(WAIT_S)
            return answers

        for client in clients[:OPEN_STREAMS]:
            assert open_stream(client) == [None]
        (error,) = open_stream(clients[-1])
        assert error is not None and "--max-open-streams" in error.message()
        assert "UNAVAILABLE" in error.status()
        clients[-1].stop_stream()
        status, body = post(limited, "/v2/models/repeat/generate_stream", b'{"IN": [1]}')
        assert status == 503 and "--max-open-streams" in json.loads(body)["error"]
        assert_serves(limited)  # unary calls are not streams
        clients[0].stop_stream()
        deadline = time.monotonic() + WAIT_S
        while True:  # the server sees the stream end a moment after the client
            answers = open_stream(clients[-1])
            if answers == [None] or time.monotonic() > deadline:
                break
            clients[-1].stop_stream()
            time.sleep(0.05)
        assert answers == [None]
    finally:
        for client in clients:
            client.stop_stream()
            client.close()


# -- overload ----------------------------------------------------------------------------------

def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_overload_is_shed_fast_and_the_server_recovers(limited):
    """Many threads offer far more than a 2-instance model that takes SLOW_S a request can
    run: what does not fit the bounded queue is refused at once, what fits succeeds within
    the time the queue takes to drain, and memory stays put."""
    rss_before = rss_kib(limited.process.pid)
    accepted, rejected, failures = [], [], []
    stop = time.monotonic() + 2.0

    def http_load():
        conn = http.client.HTTPConnection(limited.http_url, timeout=WAIT_S)
        body = slow_body(SLOW_S)
        while time.monotonic() < stop:
            start = time.monotonic()
            conn.request("POST", "/v2/models/slow/infer", body)
            resp = conn.getresponse()
            payload = resp.read()
            took = time.monotonic() - start
            if resp.status == 200:
                accepted.append(took)
            elif resp.status == 503 and b"Exceeds maximum queue size" in payload:
                rejected.append(took)
                time.sleep(RETRY_S)
            else:
                failures.append((resp.status, payload))
        conn.close()

    def grpc_load():
        with grpcclient.InferenceServerClient(limited.grpc_url) as client:
            tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
            tensor.set_data_from_numpy(np.array([SLOW_S], np.float32))
            while time.monotonic() < stop:
                start = time.monotonic()
                try:
                    client.infer("slow", [tensor])
                    accepted.append(time.monotonic() - start)
                except InferenceServerException as e:
                    if (e.status() == "StatusCode.UNAVAILABLE"
                            and "Exceeds maximum queue size" in e.message()):
                        rejected.append(time.monotonic() - start)
                        time.sleep(RETRY_S)
                    else:
                        failures.append((e.status(), e.message()))

    threads = [threading.Thread(target=http_load) for _ in range(8)]
    threads += [threading.Thread(target=grpc_load) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S * 3)
    assert not failures, failures[:5]
    # 2 instances x (1 running + 1 waiting in the worker) + the queue: the most in flight.
    in_flight = 4 + QUEUE
    assert len(rejected) > len(accepted)
    assert statistics.median(rejected) < SLOW_S / 2
    assert max(accepted) < (in_flight / 2 + 1) * SLOW_S * 3
    assert rss_kib(limited.process.pid) - rss_before < 100 * 1024
    start = time.monotonic()
    status, _ = post(limited, "/v2/models/slow/infer", slow_body(0.0))
    assert status == 200 and time.monotonic() - start < 2.0
