"""The opentelemetry trace mode end to end: a server exporting to a collector of the test's own,
the spans of a gRPC request, an ensemble and an HTTP request carrying a client's trace context,
laid out as Triton 2.51 exports them (probed with a collector), and the settings as shown."""

import json
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import start_server, stop_server
from tests.e2e.test_bls import probe_inputs
from tests.unit.observability.test_otel import Collector

MODELS = ("identity_fp32", "ens_large", "bls_probe", "add_sub")


@pytest.fixture(scope="module")
def exporting(test_repository, tmp_path_factory):
    collector = Collector()
    folder = tmp_path_factory.mktemp("otel")
    server = start_server(test_repository, str(folder / "s.log"), "--model-control-mode=explicit",
                          *(f"--load-model={m}" for m in MODELS),
                          "--trace-config=mode=opentelemetry", "--trace-config=level=TIMESTAMPS",
                          "--trace-config=rate=1",
                          f"--trace-config=opentelemetry,url=127.0.0.1:{collector.port}/v1/traces",
                          "--trace-config=opentelemetry,resource=service.name=shm-test",
                          "--trace-config=opentelemetry,bsp_schedule_delay=50",
                          wait_models=MODELS)
    server.collector = collector
    yield server
    stop_server(server)
    collector.close()


def spans_of(collector, request_id: str, want: int, timeout: float = 10.0) -> list:
    """The spans of the OpenTelemetry trace(s) holding request `request_id`'s model spans."""
    deadline = time.monotonic() + timeout
    while True:
        spans = [s for _, _, body in list(collector.posts) for rs in body["resourceSpans"]
                 for ss in rs["scopeSpans"] for s in ss["spans"]]
        traces = {s["traceId"] for s in spans
                  if {"key": "triton.request_id", "value": {"stringValue": request_id}}
                  in s.get("attributes", ())}
        mine = [s for s in spans if s["traceId"] in traces]
        if len(mine) >= want or time.monotonic() > deadline:
            return mine
        time.sleep(0.05)


def identity_input(module, name="INPUT0"):
    tensor = module.InferInput(name, [1, 4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    return tensor


def test_a_grpc_request_is_three_spans(exporting):
    with grpcclient.InferenceServerClient(exporting.grpc_url) as client:
        client.infer("identity_fp32", [identity_input(grpcclient)], request_id="otel-grpc")
    spans = {s["name"]: s for s in spans_of(exporting.collector, "otel-grpc", want=3)}
    assert sorted(spans) == ["InferRequest", "compute", "identity_fp32"]
    request, model, compute = spans["InferRequest"], spans["identity_fp32"], spans["compute"]
    assert model["parentSpanId"] == request["spanId"]
    assert compute["parentSpanId"] == model["spanId"]
    assert [e["name"] for e in request["events"]] == [
        "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE", "GRPC_SEND_START", "GRPC_SEND_END"]
    assert [e["name"] for e in model["events"]] == ["REQUEST_START", "QUEUE_START",
                                                    "REQUEST_END"]
    # Unix time, not the monotonic clock of the trace files.
    assert abs(int(model["startTimeUnixNano"]) / 1e9 - time.time()) < 300
    path, content_type, body = exporting.collector.posts[0]
    assert (path, content_type) == ("/v1/traces", "application/json")
    resource = {a["key"]: a["value"]["stringValue"]
                for a in body["resourceSpans"][0]["resource"]["attributes"]}
    assert resource["service.name"] == "shm-test"


def test_the_steps_of_an_ensemble_are_spans_under_its_model_span(exporting):
    with grpcclient.InferenceServerClient(exporting.grpc_url) as client:
        client.infer("ens_large", [identity_input(grpcclient, "INPUT")], request_id="otel-ens")
    spans = spans_of(exporting.collector, "otel-ens", want=6)
    (ensemble,) = [s for s in spans if s["name"] == "ens_large"]
    steps = [s for s in spans if s["name"] == "identity_fp32"]
    assert len(steps) == 2
    assert all(s["parentSpanId"] == ensemble["spanId"] for s in steps)
    computes = [s for s in spans if s["name"] == "compute"]
    assert sorted(c["parentSpanId"] for c in computes) == sorted(s["spanId"] for s in steps)
    assert len({s["traceId"] for s in spans}) == 1


def test_an_http_request_with_a_trace_context_joins_the_clients_trace(exporting):
    trace_id, parent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    with httpclient.InferenceServerClient(exporting.http_url) as client:
        client.infer("identity_fp32", [identity_input(httpclient)], request_id="otel-http",
                     headers={"traceparent": f"00-{trace_id}-{parent}-01"})
    spans = {s["name"]: s for s in spans_of(exporting.collector, "otel-http", want=3)}
    assert {s["traceId"] for s in spans.values()} == {trace_id}
    assert spans["InferRequest"]["parentSpanId"] == parent
    assert [e["name"] for e in spans["InferRequest"]["events"]] == [
        "HTTP_RECV_START", "HTTP_RECV_END", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START",
        "HTTP_SEND_END"]


def test_a_generate_request_with_a_trace_context_joins_the_clients_trace(exporting):
    trace_id, parent = "5af7651916cd43dd8448eb211c80319d", "c7ad6b7169203332"
    r = httpx.post(f"http://{exporting.http_url}/v2/models/identity_fp32/generate",
                   json={"INPUT0": [1.0, 2.0], "id": "otel-generate"},
                   headers={"traceparent": f"00-{trace_id}-{parent}-01"}, timeout=30)
    assert r.status_code == 200, r.text
    spans = {s["name"]: s for s in spans_of(exporting.collector, "otel-generate", want=3)}
    assert {s["traceId"] for s in spans.values()} == {trace_id}
    assert spans["InferRequest"]["parentSpanId"] == parent
    assert [e["name"] for e in spans["InferRequest"]["events"]][:2] == [
        "HTTP_RECV_START", "HTTP_RECV_END"]


def test_a_grpc_stream_with_a_trace_context_puts_each_request_in_the_clients_trace(exporting):
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    results = []
    with grpcclient.InferenceServerClient(exporting.grpc_url) as client:
        client.start_stream(callback=lambda result, error: results.append((result, error)),
                            headers={"traceparent": f"00-{trace_id}-{parent}-01"})
        for i in range(2):
            client.async_stream_infer("identity_fp32", [identity_input(grpcclient)],
                                      request_id=f"otel-stream-{i}")
        client.stop_stream()
    assert [error for _, error in results] == [None, None]
    for i in range(2):
        spans = {s["name"]: s for s in spans_of(exporting.collector, f"otel-stream-{i}", want=3)}
        assert spans["identity_fp32"]["traceId"] == trace_id
        assert spans["InferRequest"]["parentSpanId"] == parent


def test_a_model_gets_the_context_of_its_model_span_and_its_bls_requests_are_children(
        exporting):
    trace_id, parent = "0af7651916cd43dd8448eb211c12666c", "b7ad6b7169242424"
    x = np.array([1, 2, 3, 4], np.float32)
    with httpclient.InferenceServerClient(exporting.http_url) as client:
        result = client.infer("bls_probe", probe_inputs(httpclient, "traced", x, x),
                              request_id="otel-context",
                              headers={"traceparent": f"00-{trace_id}-{parent}-01"})
    context = json.loads(result.as_numpy("TEXT")[0])
    # InferRequest, bls_probe and its compute; add_sub (the traced BLS call) and its compute.
    spans = spans_of(exporting.collector, "otel-context", want=5)
    by_name = {s["name"]: s for s in spans}
    model_span = by_name["bls_probe"]["spanId"]
    assert context == {"traceparent": f"00-{trace_id}-{model_span}-01"}
    assert by_name["add_sub"]["parentSpanId"] == model_span
    assert {s["traceId"] for s in spans} == {trace_id}


def test_the_settings_show_the_mode_and_its_own_settings(exporting):
    with httpclient.InferenceServerClient(exporting.http_url) as client:
        settings = client.get_trace_settings()
    assert settings["trace_mode"] == "opentelemetry"
    assert "trace_file" not in settings and "log_frequency" not in settings  # as Triton
    assert settings["url"].endswith("/v1/traces")
    assert settings["resource"] == "service.name=shm-test"
    assert (settings["bsp_schedule_delay"], settings["bsp_max_queue_size"],
            settings["bsp_max_export_batch_size"]) == ("50", "2048", "512")
