"""Ensembles end to end over tritonclient HTTP and gRPC: `ensemble_pipeline` (two add_sub
steps), `ens_large` (two identity_fp32 steps, tensors big enough to pass through the output
arenas), `ens_fail` (a step that raises), `ens_stream` (a decoupled step, `repeat`, feeding
`echo_all`), `ens_partial` (a step that leaves an output out), and an ensemble whose step
model does not exist."""

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server, stop_server, wait_for_models

MODELS = ("ensemble_pipeline", "ens_large", "ens_fail", "ens_stream", "ens_partial")
PROTOCOLS = {"http": httpclient, "grpc": grpcclient}


@pytest.fixture(scope="module", autouse=True)
def models_ready(server):
    wait_for_models(server, MODELS)


def infer(clients, protocol, model, arrays, outputs=None):
    lib = PROTOCOLS[protocol]
    inputs = []
    for name, array in arrays.items():
        t = lib.InferInput(name, list(array.shape), "FP32" if array.dtype == np.float32
                           else "INT32")
        t.set_data_from_numpy(array)
        inputs.append(t)
    requested = [lib.InferRequestedOutput(n) for n in outputs] if outputs else None
    return clients[protocol].infer(model, inputs, outputs=requested)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_pipeline_results(clients, protocol):
    a = np.array([1, 2, 3, 4], np.float32)
    b = np.array([10, 20, 30, 40], np.float32)
    result = infer(clients, protocol, "ensemble_pipeline", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)
    np.testing.assert_array_equal(result.as_numpy("DOUBLE0"), 2 * a)
    np.testing.assert_array_equal(result.as_numpy("DOUBLE1"), 2 * b)
    only = infer(clients, protocol, "ensemble_pipeline", {"INPUT0": a, "INPUT1": b},
                 outputs=["DOUBLE1"])
    np.testing.assert_array_equal(only.as_numpy("DOUBLE1"), 2 * b)
    assert only.as_numpy("SUM") is None


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_large_intermediates(clients, protocol):
    x = np.random.default_rng(7).random((3, 50_000), np.float32)  # 600 kB: arena, not inline
    for _ in range(3):
        result = infer(clients, protocol, "ens_large", {"INPUT": x})
        np.testing.assert_array_equal(result.as_numpy("OUTPUT"), x)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_failing_step_fails_the_request_with_its_message(clients, protocol):
    a = np.ones(4, np.float32)
    with pytest.raises(InferenceServerException) as info:
        infer(clients, protocol, "ens_fail", {"INPUT0": a, "INPUT1": a})
    message = info.value.message()
    assert "in ensemble 'ens_fail'" in message and "raiser always fails" in message
    # the server still serves
    infer(clients, protocol, "ensemble_pipeline", {"INPUT0": a, "INPUT1": a})


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_response_carries_the_sequence_fields_as_in_triton(clients, protocol):
    a = np.ones(4, np.float32)
    result = infer(clients, protocol, "ensemble_pipeline", {"INPUT0": a, "INPUT1": a})
    parameters = result.get_response()
    if protocol == "grpc":
        parameters = {key: getattr(value, value.WhichOneof("parameter_choice"))
                      for key, value in parameters.parameters.items()}
    else:
        parameters = parameters["parameters"]
    assert parameters == {"sequence_id": 0, "sequence_start": False, "sequence_end": False}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_output_a_step_left_out_is_absent(clients, protocol):
    mode = {"MODE": np.array([1], np.int32)}
    # The next step runs without it, and says what it misses.
    with pytest.raises(InferenceServerException) as info:
        infer(clients, protocol, "ens_partial", mode)
    assert info.value.message().startswith(
        "in ensemble 'ens_partial', [request id: <id_unknown>] expected 2 inputs but got 0 "
        "inputs for model 'add_sub'")
    # Asked only for what the step gave, the ensemble answers.
    result = infer(clients, protocol, "ens_partial", mode, outputs=["A"])
    assert result.as_numpy("A").tolist() == [1]
    full = infer(clients, protocol, "ens_partial", {"MODE": np.array([0], np.int32)})
    assert full.as_numpy("SUM").tolist() == [2, 4, 6, 8]


def test_config_metadata_and_statistics(clients):
    http = clients["http"]
    config = http.get_model_config("ens_stream")
    assert config["platform"] == "ensemble"
    assert config["model_transaction_policy"]["decoupled"] is True
    assert [(s["model_name"], s["model_version"])
            for s in config["ensemble_scheduling"]["step"]] == [("repeat", -1), ("echo_all", -1)]
    assert http.get_model_config("ensemble_pipeline")["model_transaction_policy"] == {
        "decoupled": False}
    assert http.get_model_metadata("ensemble_pipeline")["platform"] == "ensemble"

    def counts(model):
        stats = http.get_inference_statistics(model)["model_stats"][0]
        return stats["inference_count"], stats["inference_stats"]["success"]["count"]

    before_ensemble, before_step = counts("ensemble_pipeline"), counts("add_sub")
    a = np.ones(4, np.float32)
    infer(clients, "grpc", "ensemble_pipeline", {"INPUT0": a, "INPUT1": a})
    assert counts("ensemble_pipeline") == (before_ensemble[0] + 1, before_ensemble[1] + 1)
    # each step counts as a request made to add_sub directly
    assert counts("add_sub") == (before_step[0] + 2, before_step[1] + 2)


def test_decoupled_step_streams_the_ensemble(server, clients):
    values = np.array([5, 6, 7], np.int32)
    with pytest.raises(InferenceServerException):  # decoupled: one-response APIs refuse it
        infer(clients, "http", "ens_stream", {"IN": values})
    responses = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        t = grpcclient.InferInput("IN", [3], "INT32")
        t.set_data_from_numpy(values)
        client.async_stream_infer("ens_stream", [t], enable_empty_final_response=True)
        got = []
        while True:
            result, error = responses.get(timeout=10)
            assert error is None
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                break
            got.append((int(result.as_numpy("OUT")[0]), int(result.as_numpy("IDX")[0])))
        assert got == [(5, 0), (6, 1), (7, 2)]
    finally:
        client.stop_stream()
        client.close()


def test_ensemble_of_a_missing_model_is_unavailable(tmp_path):
    repo = tmp_path / "repo"
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text("""
        name: "broken" platform: "ensemble" max_batch_size: 0
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
        ensemble_scheduling { step [ { model_name: "absent" model_version: -1
            input_map { key: "X" value: "IN" } output_map { key: "Y" value: "OUT" } } ] }""")
    srv = start_server(str(repo), str(tmp_path / "log"))
    try:
        client = httpclient.InferenceServerClient(srv.http_url)
        index = client.get_model_repository_index()
        assert index == [{"name": "broken", "state": "UNAVAILABLE",
                          "reason": "ensemble broken contains models that are not available or "
                                    "ambiguous: absent"}]
        assert not client.is_model_ready("broken")
        client.close()
    finally:
        stop_server(srv)
