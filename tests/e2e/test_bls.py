"""Models calling the server from their worker: BLS (`InferenceRequest.exec`, `async_exec`,
decoupled) and model control (`is_model_ready`, `load_model`), through the test model
`bls_probe` (tests/models/README.md), over both protocols."""

import importlib.util
import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from shmserve.repository.loader import gpu_count
from tests.conftest import start_server, stop_server, wait_for_models

MODELS = ("bls_probe", "add_sub", "repeat", "string_echo", "raiser", "request_probe",
          "identity_fp32", "params_echo")
X = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
Y = np.array([0.5, 0.5, 0.5, 0.5], np.float32)


@pytest.fixture(scope="module", autouse=True)
def models_ready(server):
    wait_for_models(server, MODELS)


def probe_inputs(module, mode, x=None, y=None) -> list:
    """bls_probe's inputs as `module` (tritonclient.http or .grpc) builds them."""
    inputs = []
    for name, value in (("MODE", np.array([mode.encode()], np.object_)), ("INPUT0", x),
                        ("INPUT1", y)):
        if value is not None:
            tensor = module.InferInput(name, list(value.shape),
                                       "BYTES" if value.dtype == np.object_ else "FP32")
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
    return inputs


def probe(clients, protocol, mode, x=None, y=None):
    module = httpclient if protocol == "http" else grpcclient
    return clients[protocol].infer("bls_probe", probe_inputs(module, mode, x, y))


def text(result) -> list:
    return [v.decode() for v in result.as_numpy("TEXT")]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_exec_from_execute_gets_the_other_models_answer(clients, protocol):
    result = probe(clients, protocol, "sync", X, Y)
    assert result.as_numpy("OUTPUT0").tolist() == (X + Y).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == (X - Y).tolist()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_async_exec_runs_calls_at_once_and_keeps_only_the_requested_outputs(clients, protocol):
    result = probe(clients, protocol, "async", X, Y)
    assert result.as_numpy("OUTPUT0").tolist() == (X + Y).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == (Y + X).tolist()
    assert text(result) == ["OUTPUT0"]


def test_a_bls_response_carries_the_parameters_the_model_gave_it(clients):
    result = probe(clients, "grpc", "params", X)
    assert json.loads(text(result)[0]) == {"k": "v", "n": 3, "b": True}


def test_processes_a_model_forks_call_the_server_too(server, clients):
    """A multiprocessing Pool's children (forked from execute) call add_sub and identity_fp32
    (1 MiB each way), as in Triton; the server goes on serving, and no child is left."""
    before = server.workers()
    result = probe(clients, "http", "fork_pool", X, Y)
    assert result.as_numpy("OUTPUT0").tolist() == np.concatenate(
        [X + Y * k for k in (1, 2, 3)]).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == [k * (1 << 18) for k in (1, 2, 3)]
    assert probe(clients, "grpc", "sync", X, Y).as_numpy("OUTPUT0").tolist() == (X + Y).tolist()
    assert server.workers() == before


def test_exec_decoupled_iterates_every_response_then_the_empty_final(clients):
    values = np.array([5, 7, 9], np.float32)
    result = probe(clients, "grpc", "stream", values)
    assert result.as_numpy("OUTPUT0").tolist() == [5.0, 7.0, 9.0]
    # repeat sends its final flag alone: the iterator ends with one empty response.
    assert text(result) == ["empty 1"]


def test_async_exec_decoupled_gives_an_iterator_next_works_on(clients):
    """As Triton's ResponseIterator: next() as well as `async for`."""
    result = probe(clients, "grpc", "stream_async", np.array([5, 7, 9], np.float32))
    assert result.as_numpy("OUTPUT0").tolist() == [5.0, 7.0, 9.0]


def test_a_decoupled_calls_iterator_cancelled_runs_on_to_the_final_response(clients):
    """cancel() on a decoupled BLS iterator asks the model to stop (Triton 2.57); the
    iterator still gives what the model sends, to its final response (Triton since 2.58):
    `repeat` stops at once, its final flag alone, after what it had sent meanwhile."""
    result = probe(clients, "grpc", "stream_cancel", np.arange(1, 500, dtype=np.float32))
    assert result.as_numpy("OUTPUT0").tolist() == [1.0]
    (seen,) = text(result)
    after = int(seen.removeprefix("after cancel "))
    assert 1 <= after < 498  # at least the final flag; far from all


def test_a_calls_timeout_reaches_the_called_model_and_a_bytes_name_is_a_name(clients):
    result = probe(clients, "grpc", "timeout")
    assert result.as_numpy("OUTPUT0").tolist() == [123456.0]


def test_bls_from_initialize_fails_as_in_triton(clients):
    t = grpcclient.InferInput("INPUT0", [1], "INT32")
    t.set_data_from_numpy(np.array([1], np.int32))
    result = clients["grpc"].infer("request_probe", [t])
    assert result.as_numpy("INIT_BLS")[0] == (b"BLS is only supported during the 'execute' "
                                              b"function.")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_clients_timeout_parameter_is_the_models_request_timeout(clients, protocol):
    module = httpclient if protocol == "http" else grpcclient
    t = module.InferInput("INPUT0", [1], "INT32")
    t.set_data_from_numpy(np.array([1], np.int32))
    result = clients[protocol].infer("request_probe", [t], timeout=654321)
    assert result.as_numpy("TIMEOUT").tolist() == [654321]


def test_preferred_memory_gpu_puts_outputs_on_the_gpu_where_there_is_one(clients):
    """Without a GPU (or cupy) the call still answers, in host memory."""
    # The worker runs this interpreter: it has cupy where this process finds it.
    expected = "gpu" if gpu_count() and importlib.util.find_spec("cupy") else "cpu"
    result = probe(clients, "grpc", "preferred_gpu", X, Y)
    assert result.as_numpy("OUTPUT0").tolist() == (X + Y).tolist()
    assert text(result) == [expected]


def test_bytes_tensors_travel_both_ways(clients):
    assert text(probe(clients, "http", "bytes")) == ["alpha", "", "gamma"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_large_tensors_go_by_reference_and_come_back_intact(clients, protocol):
    # 4 MiB each way: inputs through the caller's BLS arena, outputs copied out of the
    # target's output arena (the small tensors above stay inline). Repeated, so that freed
    # blocks and released slots are used again.
    rng = np.random.default_rng(7)
    for _ in range(3):
        x = rng.standard_normal(1 << 20).astype(np.float32)
        result = probe(clients, protocol, "large", x)
        assert np.array_equal(result.as_numpy("OUTPUT0"), x)
        assert np.array_equal(result.as_numpy("OUTPUT1"), x * 2 + x * 3)


def test_a_failed_call_comes_back_as_a_response_with_the_error(clients):
    # As Triton 2.51's Python backend answers (perf/compat_probe.py compares them): every
    # failed call is INTERNAL; one refused before a model ran it names the model first.
    answers = text(probe(clients, "grpc", "errors", X))
    assert answers[0::2] == ["__ErrorCode.INTERNAL"] * 3
    missing, decoupled, raised = answers[1::2]
    assert missing == ("Model no_such_model - Error when running inference: Failed for execute "
                       "the inference request. Model 'no_such_model' is not ready.")
    assert decoupled.startswith("Model repeat - Error when running inference: Model repeat is "
                                "using the decoupled.") and "decoupled=True" in decoupled
    assert raised.startswith("Failed to process the request(s) for model instance 'raiser_0_0', "
                             "message: TritonModelException: raiser always fails")


def test_model_control_from_a_model(tmp_path, test_repository):
    server = start_server(test_repository, str(tmp_path / "shmserve.log"),
                          "--model-control-mode=explicit", "--load-model=bls_probe",
                          "--load-model=add_sub", wait_models=("bls_probe", "add_sub"))
    try:
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            ready, load, unload = control(client, "identity_fp32")
            assert (json.loads(ready), load, unload) == ([False, True, False], "ok", "ok")
            ready, load, unload = control(client, "no_such_model")
            assert json.loads(ready) == [False, False, False]
            assert "failed to load 'no_such_model'" in load
    finally:
        stop_server(server)


def control(client, target: str) -> list:
    mode = grpcclient.InferInput("MODE", [1], "BYTES")
    mode.set_data_from_numpy(np.array([b"control"], np.object_))
    result = client.infer("bls_probe", [mode], parameters={"target": target})
    return text(result)


def test_calls_work_from_initialize(clients):
    assert text(probe(clients, "grpc", "init")) == ["False"]


def test_the_caller_keeps_serving_after_its_calls(clients):
    for _ in range(20):
        assert probe(clients, "grpc", "sync", X, Y).as_numpy("OUTPUT0").tolist() == (X + Y).tolist()
