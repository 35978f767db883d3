"""A model's worker writes HTTP and gRPC infer answers itself (--worker-answers, on by default;
see shmserve/fastpath/prepared_answers.py and docs/fast-path.md): on the wire
nothing may change. Requests go to two servers, one with and one without, and must get the same
answers back (raw HTTP requests on real sockets the same bytes); the worker's own write count
(/proc/<pid>/io) shows which of them wrote the answers."""

import functools
import json
import os
import random
import socket
import struct
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.conftest import start_server, stop_server

MODELS = ("identity_fp32", "identity_batch", "partial_out", "error_response", "raiser", "slow")


@pytest.fixture(scope="module")
def servers(test_repository, tmp_path_factory):
    """{True: a server whose workers write answers, False: one whose front writes them}."""
    started = {}
    try:
        for on in (True, False):
            started[on] = start_server(
                test_repository, str(tmp_path_factory.mktemp("answers") / f"log-{on}"),
                "--model-control-mode=explicit", *(f"--load-model={m}" for m in MODELS),
                f"--worker-answers={'true' if on else 'false'}", wait_models=MODELS)
        yield started
    finally:
        for srv in started.values():
            stop_server(srv)


def infer_request(model: str, inputs: dict, headers: str = "", outputs=None) -> bytes:
    """A POST of `inputs` ({name: array}) to `model`, the tensors as binary data."""
    header = {"inputs": [{"name": name, "shape": list(a.shape),
                          "datatype": {np.float32: "FP32", np.int32: "INT32"}[a.dtype.type],
                          "parameters": {"binary_data_size": a.nbytes}}
                         for name, a in inputs.items()],
              "parameters": {"binary_data_output": True}}
    if outputs is not None:
        header["outputs"] = [{"name": n} for n in outputs]
    head = json.dumps(header).encode()
    body = head + b"".join(a.tobytes() for a in inputs.values())
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\n"
            f"Inference-Header-Content-Length: {len(head)}\r\n"
            f"Content-Length: {len(body)}\r\n{headers}\r\n").encode() + body


def read_answer(sock: socket.socket, buffered: bytearray) -> bytes:
    """One whole answer (head and body) from `sock`; what follows it stays in `buffered`."""
    while b"\r\n\r\n" not in buffered:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection before its answer"
        buffered += chunk
    end = buffered.index(b"\r\n\r\n") + 4
    length = int(_header(bytes(buffered[:end]), b"content-length"))
    while len(buffered) < end + length:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection within an answer"
        buffered += chunk
    answer = bytes(buffered[:end + length])
    del buffered[:end + length]
    return answer


def exchange(port: int, requests: list, pipelined: bool = False) -> list:
    """The answers to `requests`, sent on one connection: each after the previous answer,
    or all at once."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        buffered = bytearray()
        if pipelined:
            sock.sendall(b"".join(requests))
            return [read_answer(sock, buffered) for _ in requests]
        answers = []
        for r in requests:
            sock.sendall(r)
            answers.append(read_answer(sock, buffered))
        return answers


def _header(head: bytes, name: bytes) -> bytes:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    raise AssertionError(f"no {name!r} in {head!r}")


def binary_output(answer: bytes, dtype=np.float32) -> np.ndarray:
    head, body = answer.split(b"\r\n\r\n", 1)
    return np.frombuffer(body[int(_header(head, b"inference-header-content-length")):], dtype)


def _worker_of(srv, instance: str) -> int:
    for pid in srv.workers():
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        if any(f".{instance}." in link for link in links):
            return pid
    raise AssertionError(f"no worker of {instance}")


def written_by(pid: int) -> int:
    """Bytes the process wrote with write(2) and its kind: a worker's frames to the front
    go with sendmsg(2), which this does not count."""
    with open(f"/proc/{pid}/io") as f:
        return int(dict(line.split(": ") for line in f.read().splitlines())["wchar"])


def _vector(rng, n=16, rows=1) -> np.ndarray:
    return rng.random((rows, n), dtype=np.float32)


@pytest.mark.parametrize("on", [True, False], ids=["worker-answers", "front-answers"])
def test_repeated_requests_are_answered_by_whichever_side_is_set(servers, on):
    srv = servers[on]
    rng = np.random.default_rng(1)
    tensors = [_vector(rng) for _ in range(30)]
    worker = _worker_of(srv, "identity_fp32_0_0")
    before = written_by(worker)
    answers = exchange(srv.http_port, [infer_request("identity_fp32", {"INPUT0": t})
                                       for t in tensors])
    for tensor, answer in zip(tensors, answers):
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
        assert np.array_equal(binary_output(answer), tensor.ravel())
    grown = written_by(worker) - before
    # The first answer of the connection is the front's: it prepares the rest.
    if on:
        assert grown >= sum(len(a) for a in answers[1:])
    else:
        assert grown < len(answers[0])


def test_answers_are_the_same_bytes_either_way(servers):
    rng = np.random.default_rng(2)
    mode = {m: {"MODE": np.array([m], np.int32)} for m in (0, 1)}
    requests = [
        *(infer_request("identity_fp32", {"INPUT0": _vector(rng)}) for _ in range(3)),
        *(infer_request("identity_fp32", {"INPUT0": _vector(rng, rows=2)}) for _ in range(2)),
        # Same header, other outputs: the model leaves B out for MODE 1.
        infer_request("partial_out", mode[0]), infer_request("partial_out", mode[0]),
        infer_request("partial_out", mode[1]), infer_request("partial_out", mode[0]),
        # Asked for one output only: another header, another answer.
        infer_request("partial_out", mode[0], outputs=["B"]),
        infer_request("partial_out", mode[0], outputs=["B"]),
        *(infer_request("error_response", {"INPUT0": _vector(rng).ravel()}) for _ in range(2)),
        *(infer_request("raiser", {"INPUT0": _vector(rng).ravel()}) for _ in range(2)),
        *(infer_request("identity_fp32", {"INPUT0": _vector(rng)},
                        "Accept-Encoding: gzip\r\n") for _ in range(2)),
        *(infer_request("identity_fp32", {"INPUT0": _vector(rng)}) for _ in range(2)),
        # The last: its answer says the connection closes.
        infer_request("identity_fp32", {"INPUT0": _vector(rng)}, "Connection: close\r\n"),
    ]
    got = {on: exchange(srv.http_port, requests) for on, srv in servers.items()}
    assert got[True] == got[False]
    assert b"Connection: close" in got[True][-1]
    assert b"Content-Encoding: gzip" in got[True][-4]
    assert b"bad thing" in got[True][11] and b"raiser always fails" in got[True][13]


def test_pipelined_requests_are_answered_in_order(servers):
    rng = np.random.default_rng(3)
    tensors = [_vector(rng) for _ in range(12)]
    answers = exchange(servers[True].http_port,
                       [infer_request("identity_fp32", {"INPUT0": t}) for t in tensors],
                       pipelined=True)
    for tensor, answer in zip(tensors, answers):
        assert np.array_equal(binary_output(answer), tensor.ravel())


def test_pipelined_answers_of_both_sides_keep_their_order(servers):
    """The worker writes after its batch's Result, while the front serves the next request:
    answers the front writes (an error, another model's) come in order with the worker's
    (how the front holds them back is tested in tests/unit/http/test_http1_fast_path.py)."""
    rng = np.random.default_rng(8)
    requests = []
    for i in range(24):
        if i % 4 == 3:
            requests.append(infer_request("raiser", {"INPUT0": _vector(rng).ravel()}))
        elif i % 4 == 2:
            requests.append(infer_request("identity_batch", {"INPUT0": _vector(rng)}))
        else:
            requests.append(infer_request("identity_fp32", {"INPUT0": _vector(rng)}))
    got = {on: exchange(srv.http_port, requests, pipelined=True)
           for on, srv in servers.items()}
    assert got[True] == got[False]
    assert all(b"raiser always fails" in a for a in got[True][3::4])


@pytest.mark.parametrize("model", ["identity_fp32", "identity_batch"])
def test_concurrent_connections_each_get_their_own_answers(servers, model):
    """Batches of requests from several connections (identity_fp32 batches them on one
    instance, identity_batch runs two instances at once): each answer to its own client."""
    srv = servers[True]
    failures = []

    def client(seed: int):
        rng = np.random.default_rng(seed)
        tensors = [_vector(rng, n=int(rng.integers(1, 4)) * 8) for _ in range(40)]
        try:
            answers = exchange(srv.http_port, [infer_request(model, {"INPUT0": t})
                                               for t in tensors])
            for tensor, answer in zip(tensors, answers):
                if not np.array_equal(binary_output(answer), tensor.ravel()):
                    failures.append((seed, answer[:200]))
        except Exception as exc:  # reported below, with the others
            failures.append((seed, repr(exc)))

    instances = [f"{model}_0_{i}" for i in range(2 if model == "identity_batch" else 1)]
    workers = [_worker_of(srv, instance) for instance in instances]
    before = [written_by(pid) for pid in workers]
    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures
    # Each instance wrote answers (answers here are 300 bytes or more).
    assert all(written_by(pid) - b >= 300 for pid, b in zip(workers, before))


def test_a_client_that_leaves_before_its_answer_costs_nobody_else(servers):
    srv = servers[True]
    worker_pids = srv.workers()
    logged = len(srv.log())
    seconds = {s: np.array([s], np.float32) for s in (0.0, 0.4)}
    with socket.create_connection(("127.0.0.1", srv.http_port), timeout=30) as sock:
        buffered = bytearray()
        sock.sendall(infer_request("slow", {"INPUT0": seconds[0.0]}))
        read_answer(sock, buffered)
        # The same header again: prepared; the client leaves while the model sleeps.
        sock.sendall(infer_request("slow", {"INPUT0": seconds[0.4]}))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    rng = random.Random(4)
    for _ in range(3):
        value = np.array([rng.random() / 10], np.float32)
        answers = exchange(srv.http_port, [infer_request("slow", {"INPUT0": value})] * 2)
        for answer in answers:
            assert np.array_equal(binary_output(answer), value)
    assert srv.workers() == worker_pids  # no worker died
    assert "Traceback" not in srv.log()[logged:]


# gRPC: an answer is three HTTP/2 frames on a connection many calls share (see
# docs/fast-path.md).

def _grpc_inputs(inputs: dict) -> list:
    out = []
    for name, a in inputs.items():
        tensor = grpcclient.InferInput(name, list(a.shape), np_to_triton_dtype(a.dtype))
        tensor.set_data_from_numpy(a)
        out.append(tensor)
    return out


def _grpc_call(client, model: str, inputs: dict, **kwargs):
    """The call's ModelInferResponse as bytes, or (status, message) of its error."""
    try:
        result = client.infer(model, _grpc_inputs(inputs), **kwargs)
    except InferenceServerException as exc:
        return exc.status(), exc.message()
    return result.get_response().SerializeToString()


@pytest.mark.parametrize("on", [True, False], ids=["worker-answers", "front-answers"])
def test_grpc_repeated_calls_are_answered_by_whichever_side_is_set(servers, on):
    srv = servers[on]
    rng = np.random.default_rng(5)
    worker = _worker_of(srv, "identity_fp32_0_0")
    with grpcclient.InferenceServerClient(srv.grpc_url) as client:
        _grpc_call(client, "identity_fp32", {"INPUT0": _vector(rng)})  # prepares the rest
        before = written_by(worker)
        for _ in range(30):
            tensor = _vector(rng)
            result = client.infer("identity_fp32", _grpc_inputs({"INPUT0": tensor}))
            assert np.array_equal(result.as_numpy("OUTPUT0"), tensor)
    grown = written_by(worker) - before
    # Each answer is 150 bytes or more (frames, message, 64 bytes of output).
    assert (grown >= 30 * 150) if on else (grown < 150), grown


def test_grpc_answers_are_the_same_either_way(servers):
    rng = np.random.default_rng(6)
    mode = {m: {"MODE": np.array([m], np.int32)} for m in (0, 1)}
    calls = [
        *(("identity_fp32", {"INPUT0": _vector(rng)}, {}) for _ in range(3)),
        *(("identity_fp32", {"INPUT0": _vector(rng, rows=2)}, {}) for _ in range(2)),
        # Same fields, other outputs: the model leaves B out for MODE 1.
        ("partial_out", mode[0], {}), ("partial_out", mode[0], {}),
        ("partial_out", mode[1], {}), ("partial_out", mode[0], {}),
        *(("partial_out", mode[0], {"outputs": [grpcclient.InferRequestedOutput("B")]})
          for _ in range(2)),
        *(("error_response", {"INPUT0": _vector(rng).ravel()}, {}) for _ in range(2)),
        *(("raiser", {"INPUT0": _vector(rng).ravel()}, {}) for _ in range(2)),
        *(("identity_fp32", {"INPUT0": _vector(rng)}, {"request_id": "x"}) for _ in range(2)),
        *(("identity_fp32", {"INPUT0": _vector(rng)}, {}) for _ in range(2)),
    ]
    got = {}
    for on, srv in servers.items():
        with grpcclient.InferenceServerClient(srv.grpc_url) as client:
            got[on] = [_grpc_call(client, model, inputs, **kw) for model, inputs, kw in calls]
    assert got[True] == got[False]
    assert "bad thing" in got[True][11][1] and "raiser always fails" in got[True][13][1]


@pytest.mark.parametrize("model", ["identity_fp32", "identity_batch"])
def test_grpc_calls_in_flight_together_each_get_their_own_answer(servers, model):
    """Many calls at once on one connection, batched together (identity_fp32 on one
    instance, identity_batch on two at once): each answer on its own stream."""
    srv = servers[True]
    rng = np.random.default_rng(7)
    tensors = [_vector(rng, n=int(rng.integers(1, 4)) * 8) for _ in range(400)]
    results = [None] * len(tensors)
    done = threading.Semaphore(0)
    window = threading.Semaphore(32)

    def finished(index, result, error):
        results[index] = error if error is not None else result.as_numpy("OUTPUT0")
        window.release()
        done.release()

    instances = [f"{model}_0_{i}" for i in range(2 if model == "identity_batch" else 1)]
    workers = [_worker_of(srv, instance) for instance in instances]
    before = [written_by(pid) for pid in workers]
    with grpcclient.InferenceServerClient(srv.grpc_url) as client:
        for i, tensor in enumerate(tensors):
            window.acquire()
            client.async_infer(model, _grpc_inputs({"INPUT0": tensor}),
                               functools.partial(finished, i))
        for _ in tensors:
            assert done.acquire(timeout=60)
    for tensor, result in zip(tensors, results):
        assert isinstance(result, np.ndarray) and np.array_equal(result, tensor), result
    assert all(written_by(pid) - b >= 150 for pid, b in zip(workers, before))


def test_grpc_a_call_that_ends_while_the_worker_has_its_answer_costs_nobody_else(servers):
    """The client's deadline passes while the model runs: the client resets the stream,
    and the worker may still write the answer; the connection carries on."""
    srv = servers[True]
    worker_pids = srv.workers()
    logged = len(srv.log())
    seconds = {s: np.array([s], np.float32) for s in (0.0, 0.5, 0.05)}
    with grpcclient.InferenceServerClient(srv.grpc_url) as client:
        _grpc_call(client, "slow", {"INPUT0": seconds[0.0]})  # prepares the next
        status, _ = _grpc_call(client, "slow", {"INPUT0": seconds[0.5]}, client_timeout=0.2)
        assert status == "StatusCode.DEADLINE_EXCEEDED"
        for _ in range(4):
            result = client.infer("slow", _grpc_inputs({"INPUT0": seconds[0.05]}))
            assert np.array_equal(result.as_numpy("OUTPUT0"), seconds[0.05])
    assert srv.workers() == worker_pids  # no worker died
    assert "Traceback" not in srv.log()[logged:]
