"""Behaviours of the real Triton that a user's models and clients rely on, each against a real
server process (tests/models/README.md records what Triton answered)."""

import json
import os
import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from shmserve.repository.loader import gpu_count
from tests.conftest import start_server, stop_server

MODULES = {"http": httpclient, "grpc": grpcclient}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_sees_the_command_line_tritons_stub_gives(clients, protocol):
    t = MODULES[protocol].InferInput("INPUT0", [1], "INT32")
    t.set_data_from_numpy(np.array([1], np.int32))
    argv = clients[protocol].infer("argv_probe", [t]).as_numpy("ARGV")[0]
    assert json.loads(argv) == [""]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_output_requested_twice_is_refused(clients, protocol):
    """As Triton since 2.69 (an input given twice was refused before)."""
    mod = MODULES[protocol]
    t = mod.InferInput("INPUT0", [1, 4], "FP32")
    t.set_data_from_numpy(np.ones((1, 4), np.float32))
    outputs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT0")]
    with pytest.raises(InferenceServerException) as e:
        clients[protocol].infer("identity_fp32", [t], outputs=outputs)
    assert e.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    assert e.value.message() == ("[request id: <id_unknown>] output 'OUTPUT0' already exists "
                                 "in request")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_unary_request_whose_client_gave_up_is_cancelled_in_the_model(server, tmp_path,
                                                                       protocol):
    """A gRPC deadline that passes, or an HTTP client that closes its connection: the
    model's request.is_cancelled() turns true, as in Triton, and it can stop early."""
    record = tmp_path / "seen"
    mod = MODULES[protocol]
    t = mod.InferInput("SECONDS", [1], "FP32")
    t.set_data_from_numpy(np.array([20.0], np.float32))
    if protocol == "grpc":
        client = grpcclient.InferenceServerClient(server.grpc_url)

        def call():
            return client.infer("cancel_probe", [t], parameters={"record_to": str(record)},
                                client_timeout=0.5)
    else:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=0.5)

        def call():
            return client.infer("cancel_probe", [t], parameters={"record_to": str(record)})
    try:
        # the client's own timeout, whose type differs by protocol and client library
        with pytest.raises(Exception):  # noqa: B017
            call()
    finally:
        client.close()
    deadline = time.monotonic() + 10
    while not record.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert record.read_text() == "cancelled"


def _gather(server, counts: list) -> tuple[dict, list]:
    """Streams one async_gather request per count on one gRPC stream: ({request index:
    PEAK}, [error messages])."""
    answers = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    peaks, errors = {}, []
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for i, count in enumerate(counts):
            t = grpcclient.InferInput("COUNT", [1], "INT32")
            t.set_data_from_numpy(np.array([count], np.int32))
            client.async_stream_infer("async_gather", [t], request_id=str(i))
        for _ in counts:
            result, error = answers.get(timeout=30)
            if error is not None:
                errors.append(error.message())
            else:
                peaks[int(result.get_response().id)] = int(result.as_numpy("PEAK")[0])
        client.stop_stream()
    finally:
        client.close()
    return peaks, errors


def test_an_async_decoupled_model_has_many_requests_in_flight_on_one_instance(server):
    """As Triton's stub: execute's coroutine runs on a background event loop, and the
    instance takes the next batch while it does (each request here waits for the others)."""
    assert _gather(server, [4, 4, 4, 4]) == ({0: 4, 1: 4, 2: 4, 3: 4}, [])


def test_an_exception_in_one_async_request_leaves_the_others_alone(server):
    peaks, (error,) = _gather(server, [2, -1, 2])
    assert peaks == {0: 2, 2: 2} and "async_gather was told to fail" in error


def test_tasks_an_async_model_starts_run_between_its_calls(clients):
    t = httpclient.InferInput("INPUT0", [1], "INT32")
    t.set_data_from_numpy(np.array([1], np.int32))
    first = clients["http"].infer("async_ticker", [t]).as_numpy("TICKS")[0]
    time.sleep(0.5)  # no call runs meanwhile: only the instance's own loop moves the task
    second = clients["http"].infer("async_ticker", [t]).as_numpy("TICKS")[0]
    assert second - first >= 10


def _priority_call(client, priority, delay=0.0, **params):
    inputs = [httpclient.InferInput("INPUT0", [1, 1], "FP32"),
              httpclient.InferInput("DELAY", [1, 1], "FP32")]
    inputs[0].set_data_from_numpy(np.zeros((1, 1), np.float32))
    inputs[1].set_data_from_numpy(np.full((1, 1), delay, np.float32))
    return client.async_infer("batch_priority", inputs, priority=priority, **params)


def test_queue_policy_holds_until_a_request_starts_with_pipelining_on(test_repository, tmp_path):
    """On a server that pipelines short batches (the default), a request that arrives while
    another runs stays under its queue's policy until it starts: a higher priority overtakes
    it, and its timeout rejects it on time, before execute ever sees it."""
    srv = start_server(test_repository, str(tmp_path / "log"), "--model-control-mode=explicit",
                       "--load-model=batch_priority", wait_models=("batch_priority",))
    client = httpclient.InferenceServerClient(srv.http_url, concurrency=4)
    try:
        # A fresh instance has no batch length yet: it would pipeline the next batch.
        running = _priority_call(client, 3, delay=0.8)
        time.sleep(0.2)
        low = _priority_call(client, 3)
        time.sleep(0.1)
        high = _priority_call(client, 2)
        starts = [r.get_result().as_numpy("START")[0, 0] for r in (running, low, high)]
        assert starts[0] < starts[2] < starts[1]

        # The short batches just run make the instance pipeline again.
        running = _priority_call(client, 5, delay=1.5)
        time.sleep(0.2)
        sent = time.monotonic()
        late = _priority_call(client, 5, timeout=100_000)
        with pytest.raises(InferenceServerException) as e:
            late.get_result()
        assert time.monotonic() - sent < 1.0  # not when the running request ends
        assert e.value.status() == "503" and e.value.message() == "Request timeout expired"
        running.get_result()
        [stats] = client.get_inference_statistics("batch_priority")["model_stats"]
        assert stats["execution_count"] == 4  # the rejected request never ran
    finally:
        client.close()
        stop_server(srv)


@pytest.mark.skipif(gpu_count() > 0, reason="shows the machine without a GPU")
def test_a_gpu_group_without_a_gpu_runs_on_the_cpu_with_a_warning(test_repository, tmp_path):
    """Triton refuses such a model; shmserve runs it and says so at WARNING."""
    repo = tmp_path / "repo"
    (repo / "gpu_add").mkdir(parents=True)
    (repo / "gpu_add" / "1").symlink_to(os.path.join(test_repository, "add_sub", "1"))
    text = open(os.path.join(test_repository, "add_sub", "config.pbtxt")).read()
    text = text.replace('name: "add_sub"', 'name: "gpu_add"').split("instance_group")[0]
    (repo / "gpu_add" / "config.pbtxt").write_text(
        text + "\ninstance_group [ { kind: KIND_GPU } ]\n")
    srv = start_server(str(repo), str(tmp_path / "log"), wait_models=("gpu_add",))
    try:
        with httpclient.InferenceServerClient(srv.http_url) as client:
            [group] = client.get_model_config("gpu_add")["instance_group"]
        assert group["kind"] == "KIND_CPU"
        warning = [line for line in srv.log().splitlines() if "asks for a GPU" in line]
        assert warning and warning[0].startswith("W")
    finally:
        stop_server(srv)


def test_response_parameters_a_model_sets_reach_the_client(clients):
    """InferenceResponse(..., parameters={...}) (Triton 2.55) over both protocols."""
    sent = {"reply_s": "x", "reply_n": 7, "reply_b": True}
    for protocol, mod in MODULES.items():
        t = mod.InferInput("INPUT0", [1], "INT32")
        t.set_data_from_numpy(np.array([1], np.int32))
        result = clients[protocol].infer("params_echo", [t], parameters=sent)
        if protocol == "http":
            assert result.get_response()["parameters"] == {"s": "x", "n": 7, "b": True}
        else:
            params = result.get_response().parameters
            assert (params["s"].string_param, params["n"].int64_param,
                    params["b"].bool_param) == ("x", 7, True)


@pytest.mark.parametrize("misuse", ["twice", "returned"])
def test_a_sent_response_is_delivered_though_execute_fails_after_it(clients, server, misuse):
    """Triton delivers the response a non-decoupled model sent, and drops (and logs) the
    failure of a second send or of a response returned after the final flag."""
    for protocol, mod in MODULES.items():
        t = mod.InferInput("INPUT0", [2], "FP32")
        t.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
        result = clients[protocol].infer("sender_misuse", [t], parameters={"misuse": misuse})
        assert result.as_numpy("OUTPUT0").tolist() == [1.0, 2.0]
    assert "failed after answering request" in server.log()
