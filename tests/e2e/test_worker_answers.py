"""A model's worker writes HTTP infer answers itself (--worker-answers, on by default; see
shmserve/http/prepared_answers.py): on the wire nothing may change. Raw requests on real
sockets go to two servers, one with and one without, and must get the same bytes back; the
worker's own write count (/proc/<pid>/io) shows which of them wrote the answers."""

import json
import os
import random
import socket
import struct
import threading

import numpy as np
import pytest

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
