"""Traces as OpenTelemetry spans, exported over OTLP/HTTP in JSON: Triton's "opentelemetry" trace
mode (`--trace-config mode=opentelemetry`).

A traced request gives, as in Triton 2.51 (probed with a collector):
- an `InferRequest` span, the root, with the transport's events (HTTP_RECV_START/END,
  GRPC_WAITREAD_START/END, INFER_RESPONSE_COMPLETE, HTTP_SEND_START/END, GRPC_SEND_START/END);
- a span named after the model, child of that one, with REQUEST_START, QUEUE_START and
  REQUEST_END and the attributes triton.model_name, triton.model_version, triton.trace_id,
  triton.trace_parent_id and triton.request_id;
- a `compute` span, child of the model's, with the COMPUTE_* events (none for an ensemble).
The steps of an ensemble and the BLS requests made with the caller's trace add a model span
(child of the caller's model span) and a compute span each, in the same OpenTelemetry trace.
Spans are kind SERVER, scope `triton-server`, times in Unix nanoseconds.

Settings (`--trace-config opentelemetry,<setting>=<value>`, and the SDK's environment
variables): url (http://localhost:4318/v1/traces), resource (key=value, repeatable;
service.name is triton-inference-server unless given), and the batch span processor's
bsp_max_queue_size (2048 spans; more are dropped), bsp_schedule_delay (5000 ms between
exports) and bsp_max_export_batch_size (512 spans per export).
"""

import logging
import os
import queue
import threading
import time
import urllib.request
from dataclasses import dataclass

import orjson

from shmserve import __version__
from shmserve.errors import Code, ServerError

log = logging.getLogger("shmserve.tracing")

SCOPE = "triton-server"
SERVER_KIND = 2
# Events of the request as the transport saw it: the root span's.
TRANSPORT_EVENTS = frozenset({
    "HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END",
    "GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END",
    "INFER_RESPONSE_COMPLETE"})
MODEL_EVENTS = ("REQUEST_START", "QUEUE_START", "REQUEST_END")
# When the transport was still waiting or reading: before the request span began.
_BEFORE_START = frozenset({"HTTP_RECV_START", "GRPC_WAITREAD_START"})


@dataclass(frozen=True)
class OtelSettings:
    url: str = "http://localhost:4318/v1/traces"
    resource: tuple = ()  # (key, value) pairs, in the order given
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay: int = 5000  # milliseconds
    bsp_max_export_batch_size: int = 512

    def as_json(self) -> dict:
        """The settings as Triton's trace setting API shows them (of several resources, the
        last: Triton repeats the key, and a JSON reader keeps the last)."""
        out = {"url": self.url, "bsp_schedule_delay": str(self.bsp_schedule_delay),
               "bsp_max_export_batch_size": str(self.bsp_max_export_batch_size),
               "bsp_max_queue_size": str(self.bsp_max_queue_size)}
        if self.resource:
            key, value = self.resource[-1]
            out["resource"] = f"{key}={value}"
        return out


_NUMBERS = ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size")
_ENVIRONMENT = {"OTEL_BSP_MAX_QUEUE_SIZE": "bsp_max_queue_size",
                "OTEL_BSP_SCHEDULE_DELAY": "bsp_schedule_delay",
                "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "bsp_max_export_batch_size"}


def settings_from(given: list, environ=os.environ) -> OtelSettings:
    """The settings of `--trace-config opentelemetry,<key>=<value>` items, given as (key,
    value), over those of the SDK's environment variables; ServerError INVALID_ARG for an
    unknown key or a bad value."""
    fields: dict = {}
    resource = [tuple(pair.split("=", 1)) for pair in
                environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",") if "=" in pair]
    items = [(name, environ[var]) for var, name in _ENVIRONMENT.items() if var in environ]
    for key, value in items + list(given):
        if key == "url":
            fields["url"] = value
        elif key == "resource":
            name, sep, text = value.partition("=")
            if not sep or not name:
                raise ServerError(Code.INVALID_ARG, f"--trace-config opentelemetry,resource="
                                                    f"{value}: expected <key>=<value>")
            resource.append((name, text))
        elif key in _NUMBERS:
            if not value.isdigit() or int(value) == 0:
                raise ServerError(Code.INVALID_ARG, f"--trace-config opentelemetry,{key}="
                                                    f"{value}: expected a positive integer")
            fields[key] = int(value)
        else:
            raise ServerError(Code.INVALID_ARG, f"--trace-config opentelemetry,{key}={value}: "
                                                f"unknown setting '{key}'")
    settings = OtelSettings(resource=tuple(resource), **fields)
    if settings.bsp_max_export_batch_size > settings.bsp_max_queue_size:
        raise ServerError(Code.INVALID_ARG, "--trace-config opentelemetry: bsp_max_export_"
                                            "batch_size must not exceed bsp_max_queue_size")
    return settings


def new_trace_id() -> str:
    return os.urandom(16).hex()


def new_span_id() -> str:
    return os.urandom(8).hex()


@dataclass
class SpanIds:
    """A trace's place in its OpenTelemetry trace: the trace id, its model span's id, and
    either its request span (a client's request) or its parent's model span (a step, a BLS
    request)."""

    trace_id: str
    model_span: str
    request_span: str | None = None
    parent_span: str | None = None
    remote_parent: str | None = None  # the request span's parent, from a traceparent

    @staticmethod
    def root(trace_id: str | None = None, remote_parent: str | None = None) -> "SpanIds":
        return SpanIds(trace_id or new_trace_id(), new_span_id(), request_span=new_span_id(),
                       remote_parent=remote_parent)

    def child(self) -> "SpanIds":
        return SpanIds(self.trace_id, new_span_id(), parent_span=self.model_span)

    def model_context(self) -> str:
        """What the model's `request.trace().get_context()` gives: the W3C context of its
        model span, as JSON, so spans the model makes become that span's children (the form
        Triton 2.51 gives, probed)."""
        return f'{{"traceparent":"00-{self.trace_id}-{self.model_span}-01"}}'


def spans(events: list, ids: SpanIds, clock_offset_ns: int) -> list:
    """The OTLP spans of one finished trace's events (tracing.Trace.events); `clock_offset_ns`
    turns its CLOCK_MONOTONIC stamps into Unix time."""
    head = events[0]
    stamps = [(t["name"], t["ns"] + clock_offset_ns)
              for e in events for t in e.get("timestamps", ())]
    out = []
    model = [(n, ns) for n, ns in stamps if n in MODEL_EVENTS]
    compute = [(n, ns) for n, ns in stamps if n.startswith("COMPUTE_")]
    if ids.request_span is not None:
        request = [(n, ns) for n, ns in stamps if n in TRANSPORT_EVENTS]
        began = [ns for n, ns in request + model if n not in _BEFORE_START]
        span = _span("InferRequest", ids.trace_id, ids.request_span, ids.remote_parent,
                     request, min(began, default=0), max((ns for _, ns in stamps), default=0))
        out.append(span)
    attributes = [_attribute("triton.model_name", head.get("model_name", "")),
                  _attribute("triton.model_version", int(head.get("model_version", 0))),
                  _attribute("triton.trace_id", int(head.get("id", 0))),
                  _attribute("triton.trace_parent_id", int(head.get("parent_id") or 0)),
                  _attribute("triton.request_id", head.get("request_id", ""))]
    model_span = _span(head.get("model_name", ""), ids.trace_id, ids.model_span,
                       ids.request_span or ids.parent_span, model,
                       _first(model, "REQUEST_START"), _first(model, "REQUEST_END"))
    model_span["attributes"] = attributes
    out.append(model_span)
    if compute:
        out.append(_span("compute", ids.trace_id, new_span_id(), ids.model_span, compute,
                         _first(compute, "COMPUTE_START"), _first(compute, "COMPUTE_END")))
    return out


def _first(stamps: list, name: str) -> int:
    for n, ns in stamps:
        if n == name:
            return ns
    return max((ns for _, ns in stamps), default=0)


def _span(name: str, trace_id: str, span_id: str, parent: str | None, events: list,
          start_ns: int, end_ns: int) -> dict:
    span = {"traceId": trace_id, "spanId": span_id, "name": name, "kind": SERVER_KIND,
            "startTimeUnixNano": str(start_ns), "endTimeUnixNano": str(max(end_ns, start_ns)),
            "events": [{"name": n, "timeUnixNano": str(ns)} for n, ns in events]}
    if parent:
        span["parentSpanId"] = parent
    return span


def _attribute(key: str, value) -> dict:
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": str(value)}}


def parse_traceparent(header: str):
    """(trace id, parent span id) of a W3C traceparent header, or None if it is not one."""
    parts = header.strip().lower().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff" or len(parts[1]) != 32 \
            or len(parts[2]) != 16:
        return None
    try:
        _, trace_id, span_id = (int(part, 16) for part in parts[:3])
    except ValueError:
        return None
    return (parts[1], parts[2]) if trace_id and span_id else None


_TIME_UP = object()  # no span came before the next export was due


class SpanExporter:
    """The batch span processor and the OTLP/HTTP exporter, on a thread of their own: spans
    queue (the excess dropped), and leave every `bsp_schedule_delay` ms, or as soon as
    `bsp_max_export_batch_size` are waiting."""

    def __init__(self, settings: OtelSettings):
        self.settings = settings
        url = settings.url
        self._url = url if "://" in url else "http://" + url
        self._queue: queue.Queue = queue.Queue(settings.bsp_max_queue_size)
        self._dropped = 0
        self._failed_once = False
        resource = dict((("service.name", "triton-inference-server"),
                         ("telemetry.sdk.name", "shmserve"),
                         ("telemetry.sdk.language", "python"),
                         ("telemetry.sdk.version", __version__)))
        resource.update(settings.resource)
        self._resource = {"attributes": [_attribute(k, v) for k, v in resource.items()]}
        self._thread = threading.Thread(target=self._run, name="shmserve-otel", daemon=True)
        self._thread.start()

    def add(self, spans_: list) -> None:
        for span in spans_:
            try:
                self._queue.put_nowait(span)
            except queue.Full:
                self._dropped += 1

    def close(self, timeout_s: float = 5.0) -> None:
        """Exports what is queued, for `timeout_s` at most."""
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(timeout_s)

    def _run(self) -> None:
        delay = self.settings.bsp_schedule_delay / 1000.0
        size = self.settings.bsp_max_export_batch_size
        batch: list = []
        deadline = time.monotonic() + delay
        while True:
            try:
                span = self._queue.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                span = _TIME_UP
            if span is None:
                self._export(batch)
                return
            if span is not _TIME_UP:
                batch.append(span)
            if len(batch) >= size or time.monotonic() >= deadline:
                self._export(batch)
                batch = []
                deadline = time.monotonic() + delay

    def _export(self, batch: list) -> None:
        if not batch:
            return
        body = orjson.dumps({"resourceSpans": [{"resource": self._resource, "scopeSpans": [
            {"scope": {"name": SCOPE}, "spans": batch}]}]})
        request = urllib.request.Request(self._url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                response.read()
        except OSError as exc:  # URLError is one
            # Once at warning level: a collector that is down would otherwise flood the log.
            level = logging.DEBUG if self._failed_once else logging.WARNING
            self._failed_once = True
            log.log(level, "could not export %d spans to %s: %s", len(batch), self._url, exc)
        if self._dropped:
            log.warning("dropped %d spans: more than bsp_max_queue_size (%d) waited",
                        self._dropped, self.settings.bsp_max_queue_size)
            self._dropped = 0
