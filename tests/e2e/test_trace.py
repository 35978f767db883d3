"""The trace extension end to end: settings over HTTP and gRPC (tritonclient's
get/update_trace_settings) and the trace files, in Triton's format, of requests through both
protocols, an ensemble and a decoupled model."""

import json
import queue
import time
import urllib.error
import urllib.request
from contextlib import closing

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server, stop_server
from tests.e2e.test_bls import probe_inputs

MODELS = ("identity_fp32", "ens_large", "stream_probe", "repeat", "cache_probe", "bls_probe",
          "add_sub")
# The order a request's timestamps must come in (the transport's, where it has them, around).
CORE_ORDER = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
              "COMPUTE_OUTPUT_START", "COMPUTE_END", "INFER_RESPONSE_COMPLETE", "REQUEST_END"]


def _load_flags():
    return ["--model-control-mode=explicit", *(f"--load-model={m}" for m in MODELS)]


@pytest.fixture(scope="module")
def traced(test_repository, tmp_path_factory):
    folder = tmp_path_factory.mktemp("traces")
    server = start_server(test_repository, str(folder / "s.log"), *_load_flags(),
                          f"--trace-config=triton,file={folder}/trace.json",
                          "--trace-config=level=TIMESTAMPS", "--trace-config=rate=1",
                          "--trace-config=triton,log-frequency=1",
                          "--cache-config=local,size=1048576", wait_models=MODELS)
    server.trace_folder = folder
    yield server
    stop_server(server)


def all_traces(folder) -> list:
    """The events of each trace written so far, from every trace file."""
    found = {}
    for path in sorted(folder.glob("trace.json*")):
        try:
            events = json.loads(path.read_bytes())
        except ValueError:
            continue  # being written
        for event in events:
            found.setdefault(event["id"], []).append(event)
    return list(found.values())


def traces_of(folder, request_id: str, want: int = 1, timeout: float = 10.0) -> list:
    """The events of each trace of the request, once there are `want` of them (a thread
    writes the files)."""
    deadline = time.monotonic() + timeout
    while True:
        mine = [events for events in all_traces(folder)
                if any(e.get("request_id") == request_id for e in events)]
        if len(mine) >= want or time.monotonic() > deadline:
            return mine
        time.sleep(0.05)


def stamps(events: list) -> dict:
    return {t["name"]: t["ns"] for e in events for t in e.get("timestamps", [])}


def assert_in_order(times: dict, names: list) -> None:
    assert all(name in times for name in names), sorted(times)
    values = [times[name] for name in names]
    assert values == sorted(values), list(zip(names, values))


def identity_input(module, values):
    tensor = module.InferInput("INPUT0", [1, len(values)], "FP32")
    tensor.set_data_from_numpy(np.array([values], np.float32))
    return tensor


def test_settings_over_both_protocols(traced):
    folder = traced.trace_folder
    expected = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1",
                "log_frequency": "1", "trace_file": f"{folder}/trace.json",
                "trace_mode": "triton"}
    http = httpclient.InferenceServerClient(traced.http_url)
    with closing(http), grpcclient.InferenceServerClient(traced.grpc_url) as grpc:
        assert http.get_trace_settings() == expected
        as_grpc = grpc.get_trace_settings(model_name="identity_fp32", as_json=True)["settings"]
        assert {k: v["value"] for k, v in as_grpc.items()} == {
            k: v if isinstance(v, list) else [v] for k, v in expected.items()}
        changed = http.update_trace_settings("stream_probe", {"trace_rate": "3",
                                                              "trace_count": "2"})
        assert changed == {**expected, "trace_rate": "3", "trace_count": "2"}
        assert grpc.get_trace_settings("stream_probe", as_json=True)["settings"][
            "trace_rate"]["value"] == ["3"]
        cleared = grpc.update_trace_settings("stream_probe", {"trace_rate": None,
                                                              "trace_count": None},
                                             as_json=True)["settings"]
        assert cleared["trace_rate"]["value"] == ["1"] and cleared["trace_count"]["value"] == ["-1"]
        assert http.get_trace_settings("stream_probe") == expected
        for bad, status, grpc_status, message in (
                ({"trace_file": "/tmp/elsewhere"}, 501, "StatusCode.UNIMPLEMENTED",
                 "trace file location can not be updated through network protocol"),
                ({"trace_rate": "0"}, 400, "StatusCode.INVALID_ARGUMENT",
                 "Attempting to set invalid trace setting :sample rate must be non-zero"),
                ({"trace_count": "many"}, 400, "StatusCode.INVALID_ARGUMENT",
                 "Unable to parse 'trace_count', got: many")):
            with pytest.raises(InferenceServerException) as by_http:
                http.update_trace_settings(settings=bad)
            assert (by_http.value.status(), by_http.value.message()) == (str(status), message)
            with pytest.raises(InferenceServerException) as by_grpc:
                grpc.update_trace_settings(settings=bad)
            assert (by_grpc.value.status(), by_grpc.value.message()) == (grpc_status, message)
        with pytest.raises(InferenceServerException) as unknown:
            grpc.get_trace_settings("no_such_model")
        assert unknown.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert unknown.value.message() == "Request for unknown model : no_such_model"
        assert http.get_trace_settings() == expected  # nothing changed by the refusals
    for path, status in (("/v2/models/no_such_model/trace/setting", 400),
                         ("/v2/models/identity_fp32/versions/1/trace/setting", 404)):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://{traced.http_url}{path}", timeout=5)
        assert refused.value.code == status
    request = urllib.request.Request(f"http://{traced.http_url}/v2/trace/setting",
                                     data=b'{"trace_level": "TIMESTAMPS"}', method="POST")
    with pytest.raises(urllib.error.HTTPError) as not_a_list:
        urllib.request.urlopen(request, timeout=5)
    assert not_a_list.value.code == 400
    with urllib.request.urlopen(f"http://{traced.http_url}/v2", timeout=5) as r:
        assert "trace" in json.load(r)["extensions"]


def test_requests_over_both_protocols_are_traced(traced):
    http = httpclient.InferenceServerClient(traced.http_url)
    with closing(http), grpcclient.InferenceServerClient(traced.grpc_url) as grpc:
        http.infer("identity_fp32", [identity_input(httpclient, [1, 2])], request_id="by-http")
        grpc.infer("identity_fp32", [identity_input(grpcclient, [1, 2])], request_id="by-grpc")
    (over_http,) = traces_of(traced.trace_folder, "by-http")
    (over_grpc,) = traces_of(traced.trace_folder, "by-grpc")
    assert over_http[0] == {"id": over_http[0]["id"], "model_name": "identity_fp32",
                            "model_version": 1, "request_id": "by-http"}
    assert_in_order(stamps(over_http), ["HTTP_RECV_START", "HTTP_RECV_END", *CORE_ORDER,
                                        "HTTP_SEND_START", "HTTP_SEND_END"])
    assert_in_order(stamps(over_grpc), ["GRPC_WAITREAD_END", *CORE_ORDER, "GRPC_SEND_START",
                                        "GRPC_SEND_END"])
    # TIMESTAMPS only: no tensors.
    assert not [e for e in over_http if "activity" in e]


def test_the_tensors_level_records_inputs_and_outputs(traced):
    http = httpclient.InferenceServerClient(traced.http_url)
    with closing(http):
        http.update_trace_settings("identity_fp32",
                                   {"trace_level": ["TIMESTAMPS", "TENSORS"]})
        try:
            http.infer("identity_fp32", [identity_input(httpclient, [1.5, -2])],
                       request_id="tensors")
        finally:
            http.update_trace_settings("identity_fp32", {"trace_level": None})
    (events,) = traces_of(traced.trace_folder, "tensors")
    tensors = [(e["activity"], e["tensor"]) for e in events if "activity" in e]
    assert tensors == [
        ("TENSOR_QUEUE_INPUT", {"name": "INPUT0", "data": "1.5,-2", "shape": "1,2",
                                "dtype": "FP32"}),
        ("TENSOR_BACKEND_OUTPUT", {"name": "OUTPUT0", "data": "1.5,-2", "shape": "1,2",
                                   "dtype": "FP32"})]


def test_the_steps_of_an_ensemble_are_its_child_traces(traced):
    with grpcclient.InferenceServerClient(traced.grpc_url) as grpc:
        tensor = grpcclient.InferInput("INPUT", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
        grpc.infer("ens_large", [tensor], request_id="ensemble")
    traced_ones = traces_of(traced.trace_folder, "ensemble", want=3)
    (parent,) = [t for t in traced_ones if t[0]["model_name"] == "ens_large"]
    children = [t for t in traced_ones if t[0].get("parent_id") == parent[0]["id"]]
    assert [c[0]["model_name"] for c in children] == ["identity_fp32", "identity_fp32"]
    for child in children:
        assert_in_order(stamps(child), CORE_ORDER)
    assert_in_order(stamps(parent), ["GRPC_WAITREAD_END", "REQUEST_START", "QUEUE_START",
                                     "INFER_RESPONSE_COMPLETE", "REQUEST_END"])


def test_a_bls_request_given_the_trace_is_a_child_trace_and_others_are_not_traced(traced):
    """As Triton: a BLS request is traced only when the model passes `trace=request.trace()`,
    whatever the sampling rate (1 here)."""
    x, y = np.array([1, 2, 3, 4], np.float32), np.array([10, 20, 30, 40], np.float32)
    with grpcclient.InferenceServerClient(traced.grpc_url) as grpc:
        result = grpc.infer("bls_probe", probe_inputs(grpcclient, "traced", x, y),
                            request_id="bls-parent")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + y)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), x + y)
    # An OpenTelemetry context only in that mode, as Triton 2.51 (probed).
    assert result.as_numpy("TEXT").tolist() == [b"None"]
    (parent,) = traces_of(traced.trace_folder, "bls-parent")
    assert parent[0]["model_name"] == "bls_probe"
    deadline = time.monotonic() + 10
    while True:
        add_sub = [t for t in all_traces(traced.trace_folder) if t[0]["model_name"] == "add_sub"]
        if add_sub or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    (child,) = add_sub  # the BLS request without the trace left none
    assert child[0]["parent_id"] == parent[0]["id"]
    assert_in_order(stamps(child), CORE_ORDER)
    # The child ran within its parent's execution.
    assert stamps(parent)["COMPUTE_START"] < stamps(child)["REQUEST_START"]
    assert stamps(child)["REQUEST_END"] < stamps(parent)["COMPUTE_END"]


@pytest.mark.parametrize("model,name", [
    # stream_probe answers from a thread of its own, after execute() returned; repeat answers
    # within execute(), whose end (and compute times) comes after the final response.
    ("stream_probe", "COUNT"), ("repeat", "IN")])
def test_each_response_of_a_decoupled_model_is_stamped(traced, model, name):
    results = queue.Queue()
    with grpcclient.InferenceServerClient(traced.grpc_url) as grpc:
        grpc.start_stream(callback=lambda result, error: results.put((result, error)))
        value = grpcclient.InferInput(name, [1] if name == "COUNT" else [3], "INT32")
        value.set_data_from_numpy(np.array([3] if name == "COUNT" else [7, 8, 9], np.int32))
        grpc.async_stream_infer(model, [value], request_id=f"streamed-{model}",
                                enable_empty_final_response=True)
        got = [results.get(timeout=10) for _ in range(4)]
        grpc.stop_stream()
    assert all(error is None for _, error in got)
    (events,) = traces_of(traced.trace_folder, f"streamed-{model}")
    names = [t["name"] for e in events for t in e.get("timestamps", [])]
    assert names.count("INFER_RESPONSE_COMPLETE") == 4  # three responses and the final flag
    assert_in_order(stamps(events), ["REQUEST_START", "QUEUE_START", "COMPUTE_START",
                                     "COMPUTE_INPUT_END", "REQUEST_END"])
    assert "COMPUTE_END" in stamps(events)


def test_a_response_from_the_cache_is_traced_without_compute(traced):
    http = httpclient.InferenceServerClient(traced.http_url)
    with closing(http):
        for request_id in ("cache-miss", "cache-hit"):
            tensor = httpclient.InferInput("INPUT0", [2], "FP32")
            tensor.set_data_from_numpy(np.array([4, 2], np.float32))
            http.infer("cache_probe", [tensor], request_id=request_id)
    (missed,) = traces_of(traced.trace_folder, "cache-miss")
    (hit,) = traces_of(traced.trace_folder, "cache-hit")
    assert_in_order(stamps(missed), CORE_ORDER)
    assert_in_order(stamps(hit), ["HTTP_RECV_START", "REQUEST_START",
                                  "INFER_RESPONSE_COMPLETE", "REQUEST_END", "HTTP_SEND_END"])
    assert "COMPUTE_START" not in stamps(hit) and "QUEUE_START" not in stamps(hit)


def test_rate_and_count_pick_the_traced_requests(traced):
    http = httpclient.InferenceServerClient(traced.http_url)
    with closing(http):
        http.update_trace_settings("identity_fp32", {"trace_rate": "2", "trace_count": "2"})
        try:
            for k in range(6):
                http.infer("identity_fp32", [identity_input(httpclient, [k])],
                           request_id=f"sampled-{k}")
            assert http.get_trace_settings("identity_fp32")["trace_count"] == "0"
        finally:
            http.update_trace_settings("identity_fp32", {"trace_rate": None,
                                                         "trace_count": None})
    assert traces_of(traced.trace_folder, "sampled-2")  # the last one traced, now written
    ids = [k for k in range(6) if traces_of(traced.trace_folder, f"sampled-{k}", timeout=0)]
    assert ids == [0, 2]


def test_log_frequency_0_writes_the_traces_at_shutdown(test_repository, tmp_path):
    server = start_server(test_repository, str(tmp_path / "s.log"),
                          "--model-control-mode=explicit", "--load-model=identity_fp32",
                          "--trace-file", str(tmp_path / "trace.json"), "--trace-level",
                          "TIMESTAMPS", "--trace-rate", "1", wait_models=("identity_fp32",))
    try:
        http = httpclient.InferenceServerClient(server.http_url)
        with closing(http):
            for k in range(2):
                http.infer("identity_fp32", [identity_input(httpclient, [k])],
                           request_id=f"at-exit-{k}")
        time.sleep(0.3)
        assert not list(tmp_path.glob("trace.json*"))
    finally:
        stop_server(server)
    events = json.loads((tmp_path / "trace.json").read_bytes())
    assert sorted(e["request_id"] for e in events if "request_id" in e) == ["at-exit-0",
                                                                             "at-exit-1"]
