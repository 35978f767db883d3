"""Trace settings, sampling and trace files (shmserve/observability/tracing.py); Triton's
answers, where quoted, were probed on Triton 2.51."""

import json
import struct

import pytest

from shmserve.dispatch.memory_regions import RegionSlice, SystemRegion
from shmserve.dispatch.work_types import DeviceTensor
from shmserve.errors import Code, ServerError
from shmserve.observability.otel import OtelSettings
from shmserve.observability.tracing import (TraceFile, TraceSettings, Tracer, _values,
                                            parse_changes, settings_from_flags)


def tracer(tmp_path, **fields) -> Tracer:
    fields.setdefault("file", str(tmp_path / "trace.json"))
    return Tracer(TraceSettings(**fields))


def refused(fn, code=Code.INVALID_ARG) -> str:
    with pytest.raises(ServerError) as info:
        fn()
    assert info.value.code == code
    return info.value.message


def test_defaults_are_tritons():
    assert Tracer().settings() == {"trace_level": ["OFF"], "trace_rate": "1000",
                                   "trace_count": "-1", "log_frequency": "0", "trace_file": "",
                                   "trace_mode": "triton"}
    assert not Tracer().on


def test_changes_are_checked_with_tritons_messages():
    assert refused(lambda: parse_changes({"trace_file": ["x"]}), Code.UNSUPPORTED) == (
        "trace file location can not be updated through network protocol")
    assert refused(lambda: parse_changes({"trace_count": ["abc"]})) == (
        "Unable to parse 'trace_count', got: abc")
    assert refused(lambda: parse_changes({"trace_count": ["-5"]})) == (
        "Unable to parse 'trace_count'. Expecting value >= -1, got:-5")
    assert refused(lambda: parse_changes({"trace_rate": ["0"]})) == (
        "Attempting to set invalid trace setting :sample rate must be non-zero")
    assert refused(lambda: parse_changes({"trace_level": ["OFF", "TIMESTAMPS"]})) == (
        "Expect only one trace level 'OFF' is specified")
    assert "BOGUS" in refused(lambda: parse_changes({"trace_level": ["BOGUS"]}))
    assert "trace_rate" in refused(lambda: parse_changes({"trace_rate": ["-3"]}))
    assert "log_frequency" in refused(lambda: parse_changes({"log_frequency": ["1", "2"]}))
    # Unknown settings and the mode are ignored, as Triton does; null or [] clears.
    assert parse_changes({"foo": ["1"], "trace_mode": ["opentelemetry"]}) == {}
    assert parse_changes({"trace_rate": None, "trace_count": []}) == {"rate": None,
                                                                      "count": None}
    assert parse_changes({"trace_level": ["TENSORS", "TIMESTAMPS", "TENSORS"],
                          "trace_count": ["3"]}) == {"level": ("TENSORS", "TIMESTAMPS"),
                                                     "count": 3}


def test_tracing_needs_a_file():
    assert refused(lambda: Tracer().update("", {"level": ("TIMESTAMPS",)})) == (
        "Attempting to set invalid trace setting :trace file name is not given")


def test_one_request_in_rate_is_traced_while_the_count_lasts(tmp_path):
    t = tracer(tmp_path, level=("TIMESTAMPS",), rate=2, count=2)
    picked = [t.start("m") is not None for _ in range(7)]
    assert picked == [True, False, True, False, False, False, False]
    assert t.settings()["trace_count"] == "0"
    # Any change starts the count again, from its setting (as Triton shows it).
    t.update("", {"rate": 1})
    assert t.settings()["trace_count"] == "2"
    assert t.start("m") is not None


def test_model_overrides_and_clearing(tmp_path):
    t = tracer(tmp_path, level=("TIMESTAMPS",), rate=1)
    t.update("a", {"count": 1, "level": ("TIMESTAMPS", "TENSORS")})
    assert t.settings("a")["trace_level"] == ["TIMESTAMPS", "TENSORS"]
    assert t.settings("b") == t.settings()  # no override: the global settings
    assert t.start("a").tensors and t.start("a") is None  # its own count
    assert not t.start("b").tensors
    # A global change shows through where the model has no value of its own.
    t.update("", {"rate": 5})
    assert t.settings("a")["trace_rate"] == "5" and t.settings("a")["trace_count"] == "1"
    t.update("a", {"count": None, "level": None})
    assert t.settings("a") == t.settings()
    # A cleared global setting goes back to the command line's.
    t.update("", {"rate": None})
    assert t.settings()["trace_rate"] == "1"
    t.update("", {"level": ("OFF",)})
    assert not t.on and t.start("a") is None
    t.update("a", {"level": ("TIMESTAMPS",)})
    assert t.on and t.start("b") is None and t.start("a") is not None


def test_traces_go_to_numbered_files_every_log_frequency(tmp_path):
    t = tracer(tmp_path, level=("TIMESTAMPS",), rate=1, log_frequency=2)
    for request_id in ("r1", "r2", "r3"):
        trace = t.start("m")
        trace.model("m", 1, request_id)
        trace.stamp("REQUEST_START", 10)
        trace.finish()
        trace.finish()  # once only
    t.close()
    first = json.loads((tmp_path / "trace.json.0").read_bytes())
    assert first == [
        {"id": 1, "model_name": "m", "model_version": 1, "request_id": "r1"},
        {"id": 1, "timestamps": [{"name": "REQUEST_START", "ns": 10}]},
        {"id": 2, "model_name": "m", "model_version": 1, "request_id": "r2"},
        {"id": 2, "timestamps": [{"name": "REQUEST_START", "ns": 10}]}]
    # What is left at shutdown goes to the next file.
    assert [e["id"] for e in json.loads((tmp_path / "trace.json.1").read_bytes())] == [3, 3]
    assert not (tmp_path / "trace.json").exists()


def test_log_frequency_0_writes_one_file_at_shutdown(tmp_path):
    t = tracer(tmp_path, level=("TIMESTAMPS",), rate=1)
    parent = t.start("ens")
    parent.model("ens", 1, "")
    child = t.child(parent)
    child.model("step", 2, "")
    child.stamp("COMPUTE_START", 5)
    child.finish()
    parent.finish()
    assert not (tmp_path / "trace.json").exists()
    t.close()
    assert json.loads((tmp_path / "trace.json").read_bytes()) == [
        {"id": 2, "model_name": "step", "model_version": 2, "request_id": "", "parent_id": 1},
        {"id": 2, "timestamps": [{"name": "COMPUTE_START", "ns": 5}]},
        {"id": 1, "model_name": "ens", "model_version": 1, "request_id": ""}]


def test_levels_decide_what_a_trace_keeps(tmp_path):
    t = tracer(tmp_path, level=("TENSORS",), rate=1)
    trace = t.start("m")
    trace.stamp("REQUEST_START", 1)
    trace.tensor("TENSOR_QUEUE_INPUT", "X", "INT32", [2], struct.pack("<2i", 7, -1))
    trace.tensor("TENSOR_QUEUE_INPUT", "IN_SHM", "INT32", [2], b"")  # in shared memory
    trace.tensor("TENSOR_QUEUE_INPUT", "EMPTY", "INT32", [0], b"")
    # An ensemble step's inputs in another instance's memory (a RegionSlice, a DeviceTensor).
    trace.tensor("TENSOR_QUEUE_INPUT", "IN_ARENA", "INT32", [2],
                 RegionSlice(SystemRegion("arena", 64), 0, 8))
    trace.tensor("TENSOR_QUEUE_INPUT", "IN_GPU", "INT32", [2], DeviceTensor(b"h", 0, 0, 8))
    assert trace.events == [
        {"id": 1, "activity": "TENSOR_QUEUE_INPUT",
         "tensor": {"name": "X", "data": "7,-1", "shape": "2", "dtype": "INT32"}},
        {"id": 1, "activity": "TENSOR_QUEUE_INPUT",
         "tensor": {"name": "EMPTY", "data": "", "shape": "0", "dtype": "INT32"}}]


def test_tensor_values_print_as_triton_prints_them():
    assert _values("FP32", struct.pack("<4f", 0, 1, 2.5, 1e10)) == "0,1,2.5,1e+10"
    assert _values("BOOL", b"\x01\x00") == "1,0"
    assert _values("UINT64", struct.pack("<Q", 2**64 - 1)) == str(2**64 - 1)
    assert _values("BYTES", struct.pack("<I", 2) + b"hi" + struct.pack("<I", 0)) == "hi,"


def test_command_line_settings():
    settings = settings_from_flags(["triton,file=/tmp/t.json", "level=TIMESTAMPS",
                                    "level=TENSORS", "rate=1", "count=5", "mode=triton",
                                    "triton,log-frequency=2"])
    assert settings == TraceSettings(level=("TIMESTAMPS", "TENSORS"), rate=1, count=5,
                                     log_frequency=2, file="/tmp/t.json")
    # The older flags, which --trace-config replaced.
    assert settings_from_flags([], file="/tmp/a", levels=["TIMESTAMPS"], rate="3") == (
        TraceSettings(level=("TIMESTAMPS",), rate=3, file="/tmp/a"))
    for bad, text in ((["level=TIMESTAMPS"], "trace file name is not given"),
                      (["mode=zipkin"], "unknown trace mode 'zipkin'"),
                      (["mode=opentelemetry", "opentelemetry,colour=red"],
                       "unknown setting 'colour'"),
                      (["mode=opentelemetry", "opentelemetry,bsp_schedule_delay=soon"],
                       "positive integer"),
                      (["mode=opentelemetry", "opentelemetry,resource=lonely"],
                       "expected <key>=<value>"),
                      (["triton,colour=red"], "unknown setting 'colour'"),
                      (["other,file=x"], "unknown trace mode 'other'"),
                      (["rate"], "expected [<mode>,]<setting>=<value>"),
                      (["rate=-1"], "Unable to parse 'trace_rate'")):
        assert text in refused(lambda bad=bad: settings_from_flags(bad))


def test_opentelemetry_mode_settings(monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "team=vision,tier=gold")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "100")
    settings = settings_from_flags([
        "mode=opentelemetry", "level=TIMESTAMPS", "rate=1",
        "opentelemetry,url=127.0.0.1:4318/v1/traces", "opentelemetry,resource=service.name=a,b",
        "opentelemetry,bsp_schedule_delay=200", "opentelemetry,bsp_max_export_batch_size=50"])
    # No trace file is needed in this mode.
    assert (settings.mode, settings.level, settings.file) == ("opentelemetry", ("TIMESTAMPS",), "")
    assert settings.otel == OtelSettings(
        url="127.0.0.1:4318/v1/traces",
        resource=(("team", "vision"), ("tier", "gold"), ("service.name", "a,b")),
        bsp_max_queue_size=100, bsp_schedule_delay=200, bsp_max_export_batch_size=50)
    # As Triton shows them (probed on 2.51): the last resource, numbers as strings.
    shown = settings.as_json(-1)
    assert shown["trace_mode"] == "opentelemetry"
    assert {k: shown[k] for k in ("url", "resource", "bsp_schedule_delay",
                                  "bsp_max_export_batch_size", "bsp_max_queue_size")} == {
        "url": "127.0.0.1:4318/v1/traces", "resource": "service.name=a,b",
        "bsp_schedule_delay": "200", "bsp_max_export_batch_size": "50",
        "bsp_max_queue_size": "100"}
    # Settings of the opentelemetry mode in the triton mode change nothing.
    assert settings_from_flags(["triton,file=/t,1.json", "opentelemetry,url=x"]) == (
        TraceSettings(file="/t,1.json"))
    assert "must not exceed" in refused(lambda: settings_from_flags(
        ["mode=opentelemetry", "opentelemetry,bsp_max_queue_size=10"]))


def test_rate_0_traces_only_requests_with_a_trace_context():
    """Triton takes rate 0 on the command line (not through the API), in either mode."""
    zero = settings_from_flags(["mode=opentelemetry", "level=TIMESTAMPS", "rate=0"])
    assert zero.rate == 0 and "trace_file" not in zero.as_json(-1)
    only_context = Tracer(zero)
    try:
        assert only_context.start("m") is None
        trace = only_context.start("m", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        assert trace.span_ids.trace_id == "0af7651916cd43dd8448eb211c80319c"
    finally:
        only_context.close()


def test_an_unwritable_trace_file_is_logged_not_raised(tmp_path, caplog):
    sink = TraceFile(str(tmp_path / "missing" / "trace.json"))
    sink.add([{"id": 1}], 1)
    sink.close()
    assert "could not write the trace file" in caplog.text
