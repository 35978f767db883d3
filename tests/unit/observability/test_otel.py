"""Traces as OpenTelemetry spans (shmserve/observability/otel.py): the span layout Triton 2.51
exports (probed with a collector), and the OTLP/HTTP JSON export."""

import http.server
import json
import threading

from shmserve.observability.otel import (OtelSettings, SpanExporter, SpanIds, parse_traceparent,
                                         spans)

OFFSET = 1_700_000_000_000_000_000  # CLOCK_MONOTONIC -> Unix ns, for these tests


def events(trace_id: int, model: str, stamps: list, parent_id=None, request_id="r1") -> list:
    head = {"id": trace_id, "model_name": model, "model_version": 1, "request_id": request_id}
    if parent_id is not None:
        head["parent_id"] = parent_id
    return [head] + [{"id": trace_id, "timestamps": [{"name": n, "ns": ns}]} for n, ns in stamps]


GRPC_REQUEST = [("GRPC_WAITREAD_START", 10), ("GRPC_WAITREAD_END", 100), ("REQUEST_START", 110),
                ("QUEUE_START", 120), ("COMPUTE_START", 130), ("COMPUTE_INPUT_END", 140),
                ("COMPUTE_OUTPUT_START", 150), ("COMPUTE_END", 160),
                ("INFER_RESPONSE_COMPLETE", 170), ("REQUEST_END", 175), ("GRPC_SEND_START", 180),
                ("GRPC_SEND_END", 190)]


def by_name(span_list: list) -> dict:
    return {s["name"]: s for s in span_list}


def event_names(span: dict) -> list:
    return [e["name"] for e in span["events"]]


def test_a_request_is_a_request_span_a_model_span_and_a_compute_span():
    ids = SpanIds.root()
    out = by_name(spans(events(7, "identity_fp32", GRPC_REQUEST), ids, OFFSET))
    request, model, compute = out["InferRequest"], out["identity_fp32"], out["compute"]
    assert len(out) == 3
    assert {s["traceId"] for s in out.values()} == {ids.trace_id} and len(ids.trace_id) == 32
    assert "parentSpanId" not in request and request["spanId"] == ids.request_span
    assert model["parentSpanId"] == request["spanId"] and model["spanId"] == ids.model_span
    assert compute["parentSpanId"] == model["spanId"] and len(compute["spanId"]) == 16
    assert event_names(request) == ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END",
                                     "INFER_RESPONSE_COMPLETE", "GRPC_SEND_START",
                                     "GRPC_SEND_END"]
    assert event_names(model) == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert event_names(compute) == ["COMPUTE_START", "COMPUTE_INPUT_END",
                                    "COMPUTE_OUTPUT_START", "COMPUTE_END"]
    # Unix nanoseconds as strings; the request span begins once the request was read.
    assert request["startTimeUnixNano"] == str(OFFSET + 100)
    assert request["endTimeUnixNano"] == str(OFFSET + 190)
    assert (model["startTimeUnixNano"], model["endTimeUnixNano"]) == (str(OFFSET + 110),
                                                                       str(OFFSET + 175))
    assert compute["events"][0] == {"name": "COMPUTE_START", "timeUnixNano": str(OFFSET + 130)}
    assert all(s["kind"] == 2 for s in out.values())
    assert model["attributes"] == [
        {"key": "triton.model_name", "value": {"stringValue": "identity_fp32"}},
        {"key": "triton.model_version", "value": {"intValue": "1"}},
        {"key": "triton.trace_id", "value": {"intValue": "7"}},
        {"key": "triton.trace_parent_id", "value": {"intValue": "0"}},
        {"key": "triton.request_id", "value": {"stringValue": "r1"}}]


def test_an_ensemble_step_is_a_model_span_under_the_ensembles_model_span():
    root = SpanIds.root()
    step = root.child()
    ensemble = by_name(spans(events(1, "ens", [("REQUEST_START", 5), ("QUEUE_START", 6),
                                               ("REQUEST_END", 50)]), root, OFFSET))
    assert sorted(ensemble) == ["InferRequest", "ens"]  # no compute of its own
    out = by_name(spans(events(2, "identity_fp32", GRPC_REQUEST[2:10], parent_id=1), step,
                        OFFSET))
    assert sorted(out) == ["compute", "identity_fp32"]  # no request span of its own
    model = out["identity_fp32"]
    assert model["traceId"] == root.trace_id
    assert model["parentSpanId"] == ensemble["ens"]["spanId"]
    assert event_names(model) == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert {"key": "triton.trace_parent_id", "value": {"intValue": "1"}} in model["attributes"]


def test_a_propagated_context_gives_the_trace_and_the_request_spans_parent():
    assert parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01") == (
        "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
    for bad in ("", "00-xyz-b7ad6b7169203331-01", "00-0af7651916cd43dd8448eb211c80319c-01",
                "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "00-00000000000000000000000000000000-b7ad6b7169203331-01"):
        assert parse_traceparent(bad) is None
    ids = SpanIds.root("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
    request = by_name(spans(events(1, "m", GRPC_REQUEST), ids, OFFSET))["InferRequest"]
    assert request["traceId"] == "0af7651916cd43dd8448eb211c80319c"
    assert request["parentSpanId"] == "b7ad6b7169203331"


def test_a_model_sees_the_context_of_its_own_model_span():
    ids = SpanIds.root("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
    for place in (ids, ids.child()):
        context = json.loads(place.model_context())
        assert list(context) == ["traceparent"]
        assert parse_traceparent(context["traceparent"]) == (ids.trace_id, place.model_span)
        assert context["traceparent"].endswith("-01")  # sampled


class Collector:
    """An OTLP/HTTP receiver on 127.0.0.1: what each POST carried."""

    def __init__(self):
        self.posts = []
        self.arrived = threading.Event()
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                collector.posts.append((self.path, self.headers["Content-Type"],
                                        json.loads(body)))
                collector.arrived.set()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_spans_leave_in_batches_as_otlp_json():
    collector = Collector()
    try:
        exporter = SpanExporter(OtelSettings(
            url=f"127.0.0.1:{collector.port}/v1/traces", resource=(("service.name", "svc"),),
            bsp_schedule_delay=60_000, bsp_max_export_batch_size=3))
        three = spans(events(1, "m", GRPC_REQUEST), SpanIds.root(), OFFSET)
        exporter.add(three)  # a full batch leaves at once, not after the delay
        assert collector.arrived.wait(10)
        exporter.add(three[:1])
        exporter.close()  # what is left leaves at close
        assert len(collector.posts) == 2
        path, content_type, body = collector.posts[0]
        assert (path, content_type) == ("/v1/traces", "application/json")
        (resource_spans,) = body["resourceSpans"]
        attributes = {a["key"]: a["value"]["stringValue"]
                      for a in resource_spans["resource"]["attributes"]}
        assert attributes["service.name"] == "svc"
        (scope_spans,) = resource_spans["scopeSpans"]
        assert scope_spans["scope"] == {"name": "triton-server"}
        assert [s["name"] for s in scope_spans["spans"]] == [s["name"] for s in three]
        assert len(collector.posts[1][2]["resourceSpans"][0]["scopeSpans"][0]["spans"]) == 1
    finally:
        collector.close()


def test_an_unreachable_collector_is_logged_not_raised(caplog):
    # A delay far longer than the test: the three spans leave together, at close (with a
    # short one, a slow thread start could split them over two exports).
    exporter = SpanExporter(OtelSettings(url="http://127.0.0.1:9/v1/traces",
                                         bsp_schedule_delay=600_000))
    exporter.add(spans(events(1, "m", GRPC_REQUEST), SpanIds.root(), OFFSET))
    exporter.close()
    assert "could not export 3 spans" in caplog.text
