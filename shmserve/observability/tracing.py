"""Triton's trace extension: which inference requests are traced, and the trace files they are
written to, in Triton's format ("triton" trace mode), or the OpenTelemetry spans they are
exported as ("opentelemetry" mode, see otel.py).

Settings (`--trace-config`, HTTP `/v2/trace/setting` and `/v2/models/{m}/trace/setting`, gRPC
TraceSetting): trace_level (OFF, or TIMESTAMPS and/or TENSORS), trace_rate (one request in
`rate` is traced), trace_count (traces still to take, -1 for no limit; counts down, and starts
again from its setting whenever the settings change), log_frequency (0: every trace is written
to `trace_file` at shutdown; N: every N traces go to `trace_file.<index>`), trace_file (set at
start only) and trace_mode ("triton" or "opentelemetry", set at start only; the latter's own
settings show too). A model may override any of them but the file; a null
(HTTP) or empty (gRPC) value clears an override, or brings a global setting back to its
command-line value. Values travel as strings, as in Triton.

A trace file holds one JSON array of events, each naming its trace's `id`:
`{"id", "model_name", "model_version", "request_id"[, "parent_id"]}` once, then
`{"id", "timestamps": [{"name", "ns"}]}` per timestamp (CLOCK_MONOTONIC ns, the clock of
Triton's) and, at the TENSORS level, `{"id", "activity", "tensor": {"name", "data", "shape",
"dtype"}}` per input as queued (TENSOR_QUEUE_INPUT) and output as produced
(TENSOR_BACKEND_OUTPUT). The steps of a traced ensemble are traces of their own whose
`parent_id` is the ensemble's, and so are the BLS requests a traced request's model makes with
`trace=request.trace()`; other BLS requests are never traced, as in Triton. Files are written
by a thread of their own.
"""

import concurrent.futures
import dataclasses
import itertools
import logging
import os
import re
import struct
import time
import weakref
from dataclasses import dataclass

import orjson

from shmserve.errors import Code, ServerError
from shmserve.observability import otel

log = logging.getLogger("shmserve.tracing")

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
SETTING_NAMES = ("trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file",
                 "trace_mode")


@dataclass(frozen=True)
class TraceSettings:
    level: tuple = ("OFF",)
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    otel: "otel.OtelSettings | None" = None  # the opentelemetry mode's settings, in that mode

    @property
    def off(self) -> bool:
        return self.level == ("OFF",)

    @property
    def mode(self) -> str:
        return "triton" if self.otel is None else "opentelemetry"

    def as_json(self, remaining: int) -> dict:
        out = {"trace_level": list(self.level), "trace_rate": str(self.rate),
               "trace_count": str(remaining)}
        if self.otel is None:
            out.update(log_frequency=str(self.log_frequency), trace_file=self.file,
                       trace_mode=self.mode)
        else:  # as Triton: no file settings, the mode's own instead
            out["trace_mode"] = self.mode
            out.update(self.otel.as_json())
        return out


_FIELDS = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count",
           "log_frequency": "log_frequency"}


def parse_changes(changes: dict) -> dict:
    """{setting name: list of strings, or None to clear} -> {TraceSettings field: value or
    None}; unknown names and trace_mode are ignored, as in Triton."""
    out: dict[str, tuple[str, ...] | int | None] = {}
    for name, values in changes.items():
        if name == "trace_file":
            raise ServerError(Code.UNSUPPORTED, "trace file location can not be updated "
                                                "through network protocol")
        field = _FIELDS.get(name)
        if field is None:
            continue
        if values is None or values == []:
            out[field] = None
        elif field == "level":
            out[field] = _levels(values)
        else:
            if len(values) != 1:
                raise ServerError(Code.INVALID_ARG, f"expect only one value for '{name}'")
            out[field] = _number(name, values[0])
    return out


def _levels(values: list) -> tuple[str, ...]:
    for value in values:
        if value not in LEVELS:
            raise ServerError(Code.INVALID_ARG, f"Unable to parse 'trace_level', got: {value} "
                                                f"(expected OFF, TIMESTAMPS or TENSORS)")
    if "OFF" in values and len(values) > 1:
        raise ServerError(Code.INVALID_ARG, "Expect only one trace level 'OFF' is specified")
    return tuple(dict.fromkeys(values))


def _number(name: str, text: str) -> int:
    # ASCII digits only: int() would also take "1_000", "+5" and other scripts' digits.
    if not re.fullmatch(r"-?[0-9]+", text.strip()):
        raise ServerError(Code.INVALID_ARG, f"Unable to parse '{name}', got: {text}")
    value = int(text)
    if name == "trace_count" and value < -1:
        raise ServerError(Code.INVALID_ARG, f"Unable to parse 'trace_count'. Expecting value "
                                            f">= -1, got:{text}")
    if name == "trace_rate" and value == 0:
        raise ServerError(Code.INVALID_ARG, "Attempting to set invalid trace setting :sample "
                                            "rate must be non-zero")
    if value < (-1 if name == "trace_count" else 0) or value >= 2**32:
        raise ServerError(Code.INVALID_ARG, f"Unable to parse '{name}', got: {text}")
    return value


def _checked(settings: TraceSettings) -> TraceSettings:
    if not settings.off and not settings.file and settings.mode == "triton":
        raise ServerError(Code.INVALID_ARG, "Attempting to set invalid trace setting :trace "
                                            "file name is not given")
    return settings


class _Sampler:
    """Picks the traced requests of one set of settings: the first of every `rate`, while
    traces remain."""

    __slots__ = ("settings", "off", "seen", "remaining")

    def __init__(self, settings: TraceSettings):
        self.settings = settings
        self.off = settings.off
        self.seen = 0
        self.remaining = settings.count

    def take(self) -> bool:
        seen = self.seen
        self.seen = seen + 1
        # Rate 0 (command line only): none, but those with a client's trace context.
        if not self.settings.rate or seen % self.settings.rate or self.remaining == 0:
            return False
        if self.remaining > 0:
            self.remaining -= 1
        return True


class Tracer:
    """The server's trace settings and the traces in progress."""

    def __init__(self, settings: TraceSettings | None = None):
        self._initial = _checked(settings or TraceSettings())
        self._global = _Sampler(self._initial)
        self._overrides: dict[str, dict] = {}  # model name -> {field: value}
        self._samplers: dict[str, _Sampler] = {}  # model name -> its sampler, if overridden
        self._ids = itertools.count(1)
        # Traces in progress by id, for a BLS request that names its caller's.
        self._open: weakref.WeakValueDictionary[int, Trace] = weakref.WeakValueDictionary()
        # Where finished traces go, one of the two: an OpenTelemetry collector, or the file.
        self._file: TraceFile | None
        self._exporter: otel.SpanExporter | None
        if self._initial.otel is not None:
            self._file = None
            self._exporter = otel.SpanExporter(self._initial.otel)
            # Stamps are CLOCK_MONOTONIC, as Triton's; OpenTelemetry's times are Unix time.
            self._clock_offset = time.time_ns() - time.perf_counter_ns()
        else:
            self._file = TraceFile(self._initial.file)
            self._exporter = None
        self.on = False  # some settings trace: the transports then note when requests came
        self._refresh()

    # -- settings ----------------------------------------------------------------------------

    def settings(self, model: str = "") -> dict:
        sampler = self._samplers.get(model, self._global) if model else self._global
        return sampler.settings.as_json(sampler.remaining)

    def update(self, model: str, changes: dict) -> dict:
        """Applies parse_changes' output to the model's override, or to the global settings
        when `model` is ""; the settings after it."""
        if model:
            override = {**self._overrides.get(model, {}), **changes}
            override = {k: v for k, v in override.items() if v is not None}
            _checked(dataclasses.replace(self._global.settings, **override))  # or refused
            if override:
                self._overrides[model] = override
            else:
                self._overrides.pop(model, None)
        else:
            fields = {k: (getattr(self._initial, k) if v is None else v)
                      for k, v in changes.items()}
            self._global = _Sampler(_checked(dataclasses.replace(self._global.settings,
                                                                 **fields)))
        self._refresh()
        return self.settings(model)

    def _refresh(self) -> None:
        """Every override on top of the global settings, and its counts started again."""
        self._samplers = {model: _Sampler(dataclasses.replace(self._global.settings, **fields))
                          for model, fields in self._overrides.items()}
        self.on = not self._global.off or any(not s.off for s in self._samplers.values())

    # -- traces ------------------------------------------------------------------------------

    def start(self, model: str, traceparent: str = ""):
        """A new Trace for a request to `model`, or None when it is not sampled. In the
        opentelemetry mode, a request that carries a client's trace context (`traceparent`)
        is traced whatever the rate and count, as in Triton."""
        sampler = self._samplers.get(model, self._global)
        if sampler.off:
            return None
        context = None
        if traceparent and self._exporter is not None:
            context = otel.parse_traceparent(traceparent)
        if context is None and not sampler.take():
            return None
        settings = sampler.settings
        trace = Trace(self, next(self._ids), "TENSORS" in settings.level,
                      "TIMESTAMPS" in settings.level, settings.log_frequency)
        if self._exporter is not None:
            trace.span_ids = otel.SpanIds.root(*context) if context else otel.SpanIds.root()
        self._open[trace.id] = trace
        return trace

    def child(self, parent: "Trace") -> "Trace":
        """A trace for a request made on behalf of `parent`'s: an ensemble's step, or a BLS
        request of its model."""
        trace = Trace(self, next(self._ids), parent.tensors, parent.timestamps,
                      parent.log_frequency)
        trace.parent_id = parent.id
        if parent.span_ids is not None:
            trace.span_ids = parent.span_ids.child()
        self._open[trace.id] = trace
        return trace

    def in_progress(self, trace_id: int) -> "Trace | None":
        """The trace of that id, if it is not finished yet."""
        return self._open.get(trace_id)

    def _collect(self, trace: "Trace") -> None:
        self._open.pop(trace.id, None)
        if self._exporter is not None:
            if trace.events:
                assert trace.span_ids is not None  # every trace has them when spans are exported
                self._exporter.add(otel.spans(trace.events, trace.span_ids, self._clock_offset))
        elif self._file is not None:
            self._file.add(trace.events, trace.log_frequency)

    def close(self) -> None:
        """Writes what is left (all of it with log_frequency 0) and waits for the writes, or
        exports the spans still queued."""
        if self._exporter is not None:
            self._exporter.close()
        elif self._file is not None:
            self._file.close()


class Trace:
    """One traced request's events, written to the trace file by `finish()`."""

    __slots__ = ("_tracer", "id", "parent_id", "tensors", "timestamps", "log_frequency",
                 "events", "_finished", "span_ids", "__weakref__")

    def __init__(self, tracer: Tracer, trace_id: int, tensors: bool, timestamps: bool,
                 log_frequency: int):
        self._tracer = tracer
        self.id = trace_id
        self.parent_id: int | None = None
        self.tensors = tensors
        self.timestamps = timestamps
        self.log_frequency = log_frequency
        self.events: list = []
        self._finished = False
        self.span_ids: otel.SpanIds | None = None  # in the opentelemetry mode

    def model(self, name: str, version: int, request_id: str) -> None:
        event = {"id": self.id, "model_name": name, "model_version": int(version),
                 "request_id": request_id}
        if self.parent_id is not None:
            event["parent_id"] = self.parent_id
        self.events.append(event)

    def stamp(self, name: str, ns: int) -> None:
        if self.timestamps:
            self.events.append({"id": self.id, "timestamps": [{"name": name, "ns": ns}]})

    def tensor(self, activity: str, name: str, datatype: str, shape, data) -> None:
        """At the TENSORS level: the tensor's values, as Triton writes them. A tensor whose
        bytes are elsewhere (None, or none for a non-empty shape: a client's shared memory;
        an ensemble step's input in another instance's memory) is left out."""
        if self.tensors and isinstance(data, (bytes, bytearray, memoryview)) \
                and (len(data) or not all(shape)):
            self.events.append({"id": self.id, "activity": activity, "tensor": {
                "name": name, "data": _values(datatype, data),
                "shape": ",".join(str(d) for d in shape), "dtype": datatype}})

    @property
    def context(self) -> str:
        """The OpenTelemetry context handed to the model; "" in the triton mode."""
        return self.span_ids.model_context() if self.span_ids is not None else ""

    def finish(self) -> None:
        if not self._finished:
            self._finished = True
            self._tracer._collect(self)


_FORMATS = {"BOOL": "?", "UINT8": "B", "UINT16": "H", "UINT32": "I", "UINT64": "Q",
            "INT8": "b", "INT16": "h", "INT32": "i", "INT64": "q", "FP16": "e", "FP32": "f",
            "FP64": "d"}


def _values(datatype: str, data) -> str:
    """A tensor's elements, comma-separated: numbers as numbers, BYTES elements as text."""
    raw = bytes(data)
    if datatype == "BYTES":
        items, at = [], 0
        while at + 4 <= len(raw):
            (size,) = struct.unpack_from("<I", raw, at)
            items.append(raw[at + 4:at + 4 + size].decode("utf-8", "replace"))
            at += 4 + size
        return ",".join(items)
    code = _FORMATS.get(datatype)
    if code is None:  # BF16: raw 16-bit words
        code = "H"
    count = len(raw) // struct.calcsize(code)
    values = struct.unpack(f"<{count}{code}", raw[:count * struct.calcsize(code)])
    if code in "efd":  # as C++ streams print them: 6 significant digits, "1" for 1.0
        return ",".join(format(v, "g") for v in values)
    return ",".join(str(int(v)) for v in values)


class TraceFile:
    """Where finished traces go: all to `path` at close when their log frequency is 0, else
    every `log_frequency` traces to `path.<index>` (what is left at close too)."""

    def __init__(self, path: str):
        self._path = path
        self._pending: list = []  # events of finished traces not written yet
        self._traces = 0
        self._index = 0
        self._numbered = False  # the latest trace's log frequency was not 0
        self._writer: concurrent.futures.ThreadPoolExecutor | None = None

    def add(self, events: list, log_frequency: int) -> None:
        self._pending.extend(events)
        self._traces += 1
        self._numbered = bool(log_frequency)
        if log_frequency and self._traces >= log_frequency:
            self._write(f"{self._path}.{self._index}")
            self._index += 1

    def _write(self, path: str) -> None:
        events, self._pending, self._traces = self._pending, [], 0
        if self._writer is None:
            self._writer = concurrent.futures.ThreadPoolExecutor(1, "shmserve-trace")
        self._writer.submit(_write_file, path, events)

    def close(self) -> None:
        if self._pending:
            self._write(f"{self._path}.{self._index}" if self._numbered else self._path)
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None


def _write_file(path: str, events: list) -> None:
    try:
        with open(path, "wb") as f:
            f.write(orjson.dumps(events))
    except OSError as exc:
        log.error("could not write the trace file %s: %s", path, exc)
    else:
        log.debug("wrote %d trace events to %s", len(events), os.path.abspath(path))


def settings_from_flags(trace_config: list, *, file=None, levels=(), rate=None, count=None,
                        log_frequency=None) -> TraceSettings:
    """The settings of `--trace-config` values ("[<mode>,]<setting>=<value>": level, rate,
    count and mode are global, file and log-frequency triton's, the others opentelemetry's, see
    otel.py) and of the older --trace-file, --trace-level, --trace-rate, --trace-count and
    --trace-log-frequency; ServerError INVALID_ARG for what shmserve cannot take."""
    given = {"trace_file": file, "trace_rate": rate, "trace_count": count,
             "log_frequency": log_frequency}
    level_values = list(levels)
    trace_mode = "triton"
    otel_items = []
    for item in trace_config:
        # The first comma ends the mode: a resource value may hold more.
        mode, comma, setting = item.partition(",")
        if not comma or "=" in mode:
            mode, setting = "", item
        key, sep, value = setting.partition("=")
        if not sep:
            raise ServerError(Code.INVALID_ARG, f"--trace-config {item}: expected "
                                                f"[<mode>,]<setting>=<value>")
        if mode == "opentelemetry":
            otel_items.append((key, value))
            continue
        if mode not in ("", "triton"):
            raise ServerError(Code.INVALID_ARG, f"--trace-config {item}: unknown trace mode "
                                                f"'{mode}'")
        if key == "mode" and not mode:
            if value not in ("triton", "opentelemetry"):
                raise ServerError(Code.INVALID_ARG, f"--trace-config {item}: unknown trace "
                                                    f"mode '{value}'")
            trace_mode = value
            continue
        name = {"file": "trace_file", "log-frequency": "log_frequency", "level": "trace_level",
                "rate": "trace_rate", "count": "trace_count"}.get(key, "")
        if name == "":
            raise ServerError(Code.INVALID_ARG, f"--trace-config {item}: unknown setting '{key}'")
        if name == "trace_level":
            level_values.append(value.upper())
        elif name is not None:
            given[name] = value
    # Rate 0 traces only requests that carry a client's trace context (opentelemetry mode);
    # Triton takes it on the command line, not through the API.
    zero_rate = given["trace_rate"] is not None and str(given["trace_rate"]) == "0"
    fields = parse_changes({k: [str(v)] for k, v in given.items()
                            if v is not None and k != "trace_file"
                            and not (k == "trace_rate" and zero_rate)})
    if zero_rate:
        fields["rate"] = 0
    if level_values:
        # Several levels may be given; OFF among others leaves the others.
        on = [v for v in level_values if v != "OFF"]
        fields["level"] = _levels(on or ["OFF"])
    settings = otel.settings_from(otel_items) if trace_mode == "opentelemetry" else None
    return _checked(TraceSettings(file=given["trace_file"] or "", otel=settings, **fields))
