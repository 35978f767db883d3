"""Our `triton_python_backend_utils`: helpers, tensors, DLPack (BF16 included), requests,
responses, senders, errors, logging, metrics and the auto-complete ModelConfig."""

import json
import logging
import re

import numpy as np
import pytest

import workers.triton_python_backend_utils as pb_utils
from shmserve.ipc import datatypes
from workers import dlpack
from workers.model_api import metrics as metrics_module
from workers.model_api.context import CONTEXT

# --- type maps --------------------------------------------------------------------------------

NUMBERED = [
    (1, np.bool_), (2, np.uint8), (3, np.uint16), (4, np.uint32), (5, np.uint64),
    (6, np.int8), (7, np.int16), (8, np.int32), (9, np.int64),
    (10, np.float16), (11, np.float32), (12, np.float64), (13, np.object_),
]


@pytest.mark.parametrize("number,numpy_type", NUMBERED)
def test_triton_numbers_map_both_ways(number, numpy_type):
    assert pb_utils.triton_to_numpy_type(number) is numpy_type
    assert pb_utils.numpy_to_triton_type(numpy_type) == number
    assert pb_utils.numpy_to_triton_type(np.dtype(numpy_type)) == number


def test_type_map_edges():
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.numpy_to_triton_type(np.complex64) is None
    assert pb_utils.numpy_to_triton_type(np.dtype(">f4")) is None
    assert pb_utils.triton_to_numpy_type(14) is None  # BF16: no numpy type
    assert pb_utils.triton_to_numpy_type(0) is None


def test_triton_string_to_numpy():
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.TRITON_STRING_TO_NUMPY["TYPE_BOOL"] is bool
    with pytest.raises(KeyError):
        pb_utils.triton_string_to_numpy("TYPE_BF16")


def test_constants():
    assert pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START == 1
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END == 2
    assert pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL == 1
    assert pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE == 2
    assert pb_utils.TRITONSERVER_MEMORY_CPU != pb_utils.TRITONSERVER_MEMORY_GPU


# --- BYTES helpers ----------------------------------------------------------------------------


def test_serialize_deserialize_bytes_round_trip():
    values = np.array([[b"a", b""], ["h\xe9", b"\x00\x01"]], dtype=np.object_)
    encoded = pb_utils.serialize_byte_tensor(values)
    assert encoded == (b"\x01\x00\x00\x00a" + b"\x00\x00\x00\x00"
                       + b"\x03\x00\x00\x00h\xc3\xa9" + b"\x02\x00\x00\x00\x00\x01")
    decoded = pb_utils.deserialize_bytes_tensor(encoded)
    assert decoded.dtype == np.object_ and decoded.shape == (4,)
    assert list(decoded) == [b"a", b"", "h\xe9".encode(), b"\x00\x01"]


def test_serialize_byte_tensor_edges():
    assert pb_utils.serialize_byte_tensor(np.array([b"xy"], dtype=np.bytes_)) == b"\x02\0\0\0xy"
    assert pb_utils.serialize_byte_tensor(np.array([1, 2], dtype=np.int32)) is None
    assert pb_utils.serialize_byte_tensor(np.empty(0, dtype=np.object_)) == b""


def test_deserialize_keeps_equal_length_elements_as_bytes():
    decoded = pb_utils.deserialize_bytes_tensor(datatypes.serialize_bytes([b"ab", b"cd"]))
    assert decoded.shape == (2,) and decoded[0] == b"ab"


# --- Tensor -----------------------------------------------------------------------------------


def test_tensor_basics():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = pb_utils.Tensor("x", array)
    assert tensor.name() == "x"
    assert tensor.as_numpy() is array
    assert tensor.shape() == [2, 3]
    assert tensor.triton_dtype() == 11
    assert tensor.is_cpu()
    assert tensor.__dlpack_device__() == (dlpack.KDL_CPU, 0)


def test_tensor_rejects_empty_name_and_unsupported_dtype():
    with pytest.raises(pb_utils.TritonModelException, match="empty string"):
        pb_utils.Tensor("", np.zeros(1))
    with pytest.raises(pb_utils.TritonModelException, match="not supported"):
        pb_utils.Tensor("c", np.zeros(2, dtype=np.complex64))


def test_tensor_makes_arrays_contiguous_and_little_endian():
    strided = np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2]
    tensor = pb_utils.Tensor("s", strided)
    assert tensor.as_numpy().flags.c_contiguous
    np.testing.assert_array_equal(tensor.as_numpy(), strided)
    big = pb_utils.Tensor("b", np.array([1.5, 2.5], dtype=">f8"))
    assert big.as_numpy().dtype == np.dtype("<f8") and big.triton_dtype() == 12


def test_bytes_tensor_keeps_object_array_and_converts_string_arrays():
    objects = np.array([b"a", b"bc"], dtype=np.object_)
    assert pb_utils.Tensor("o", objects).triton_dtype() == 13
    fixed = pb_utils.Tensor("f", np.array([b"ab", b"c"]))
    assert fixed.as_numpy().dtype == np.object_ and list(fixed.as_numpy()) == [b"ab", b"c"]
    with pytest.raises(pb_utils.TritonModelException, match="string tensors"):
        pb_utils.Tensor("o", objects).to_dlpack()


def test_dlpack_round_trip_shares_memory():
    array = np.arange(12, dtype=np.int64).reshape(3, 4)
    back = pb_utils.Tensor.from_dlpack("y", pb_utils.Tensor("x", array).to_dlpack())
    assert back.name() == "y" and back.triton_dtype() == 9 and back.shape() == [3, 4]
    assert np.shares_memory(back.as_numpy(), array)


def test_dlpack_interoperates_with_numpy():
    tensor = pb_utils.Tensor("x", np.array([True, False]))
    np.testing.assert_array_equal(np.from_dlpack(tensor), [True, False])
    from_numpy = pb_utils.Tensor.from_dlpack("z", np.arange(3, dtype=np.float16))
    assert from_numpy.triton_dtype() == 10


def test_to_dlpack_of_read_only_array():
    read_only = np.frombuffer(b"\x01\x00\x02\x00", dtype=np.int16)
    tensor = pb_utils.Tensor._wrap("r", read_only, "INT16")
    np.testing.assert_array_equal(np.from_dlpack(tensor), [1, 2])


def test_from_dlpack_rejects_non_contiguous_and_non_dlpack():
    strided = np.arange(10, dtype=np.float32)[::2]
    with pytest.raises(pb_utils.TritonModelException, match="not contiguous"):
        pb_utils.Tensor.from_dlpack("x", strided)
    with pytest.raises(pb_utils.TritonModelException, match="DLPack capsule"):
        pb_utils.Tensor.from_dlpack("x", [1, 2])


def test_bf16_as_numpy_raises_but_dlpack_carries_bf16():
    bits = np.array([0x3F80, 0x4000, 0xC040], dtype=np.uint16)  # 1.0, 2.0, -3.0
    tensor = pb_utils.Tensor._wrap("h", bits, "BF16")
    assert tensor.triton_dtype() == 14
    with pytest.raises(pb_utils.TritonModelException, match="BF16"):
        tensor.as_numpy()

    capsule = tensor.to_dlpack()
    assert dlpack.dtype(capsule) == (dlpack.KDL_BFLOAT, 16, 1)
    # numpy has no bfloat16, so it must refuse the capsule: proof the label is not uint16.
    with pytest.raises((BufferError, RuntimeError, TypeError)):
        np.from_dlpack(dlpack.CapsuleExporter(capsule, (dlpack.KDL_CPU, 0)))

    back = pb_utils.Tensor.from_dlpack("h2", capsule)
    assert back.triton_dtype() == 14 and back.shape() == [3]
    assert np.shares_memory(back._array, bits)
    np.testing.assert_array_equal(back._array, bits)
    assert dlpack.dtype(pb_utils.Tensor.from_dlpack("h3", back).to_dlpack())[0] == dlpack.KDL_BFLOAT


# --- InferenceResponse, TritonError -----------------------------------------------------------


def test_inference_response():
    out = pb_utils.Tensor("o", np.zeros(2, dtype=np.float32))
    response = pb_utils.InferenceResponse(output_tensors=[out], parameters={"a": 1, "b": "x"})
    assert response.output_tensors() == [out]
    assert not response.has_error() and response.error() is None
    assert json.loads(response.parameters()) == {"a": 1, "b": "x"}
    assert pb_utils.get_output_tensor_by_name(response, "o") is out
    assert pb_utils.get_output_tensor_by_name(response, "missing") is None
    assert json.loads(pb_utils.InferenceResponse().parameters()) == {}


def test_inference_response_checks_arguments():
    with pytest.raises(pb_utils.TritonModelException, match="values"):
        pb_utils.InferenceResponse(parameters={"f": 1.5})
    with pytest.raises(pb_utils.TritonModelException, match="keys"):
        pb_utils.InferenceResponse(parameters={1: "x"})
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(output_tensors=[np.zeros(1)])
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(error="boom")


def test_triton_error_codes():
    error = pb_utils.TritonError("nope", pb_utils.TritonError.NOT_FOUND)
    assert error.message() == "nope" and error.code() == pb_utils.TritonError.NOT_FOUND
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL
    names = ["UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED",
             "ALREADY_EXISTS", "CANCELLED"]
    assert [getattr(pb_utils.TritonError, n).name for n in names] == names
    response = pb_utils.InferenceResponse(error=error)
    assert response.has_error() and response.error() is error
    assert issubclass(pb_utils.TritonModelException, Exception)


# --- InferenceRequest and its sender ----------------------------------------------------------


def _incoming(sender, **overrides):
    fields = dict(
        model_name="m", request_id="r1", correlation_id=7,
        flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START, timeout=0,
        parameters={"k": "v", "n": 3}, inputs=[pb_utils.Tensor("IN", np.ones(1))],
        requested_output_names=["OUT"], sender=sender,
    )
    fields.update(overrides)
    return pb_utils.InferenceRequest._incoming(**fields)


def test_incoming_request_accessors():
    sender = pb_utils.InferenceResponseSender(lambda response, flags: None)
    request = _incoming(sender)
    assert request.request_id() == "r1" and request.correlation_id() == 7
    assert request.flags() == pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
    assert json.loads(request.parameters()) == {"k": "v", "n": 3}
    assert request.requested_output_names() == {"OUT"}
    assert pb_utils.get_input_tensor_by_name(request, "IN").name() == "IN"
    assert pb_utils.get_input_tensor_by_name(request, "NOPE") is None
    assert request.get_response_sender() is sender
    assert not request.is_cancelled()
    assert request.trace().get_context() is None


def test_the_trace_context_is_the_one_the_front_gave():
    context = '{"traceparent":"00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01"}'
    trace = pb_utils.InferenceTrace(3, context)
    assert trace.get_context() == context
    assert trace.get_context(mode="opentelemetry") == context
    assert trace.get_context(mode="triton") is None
    assert pb_utils.InferenceTrace(3).get_context() is None  # traced in the triton mode


def test_cancellation_reaches_request_and_sender():
    cancelled = [False]
    sender = pb_utils.InferenceResponseSender(lambda r, f: None, is_cancelled=lambda: cancelled[0])
    request = _incoming(sender)
    assert not request.is_cancelled()
    cancelled[0] = True
    assert request.is_cancelled() and sender.is_cancelled()


def test_sender_forwards_and_closes_after_final():
    calls = []
    sender = pb_utils.InferenceResponseSender(lambda *call: calls.append(call))
    response = pb_utils.InferenceResponse()
    sender.send(response)
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert calls == [(response, 0), (None, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)]
    with pytest.raises(pb_utils.TritonModelException, match="has been closed"):
        sender.send(response)


def test_sender_checks_arguments():
    sender = pb_utils.InferenceResponseSender(lambda r, f: None)
    with pytest.raises(pb_utils.TritonModelException, match="Unsupported flag"):
        sender.send(pb_utils.InferenceResponse(), flags=4)
    with pytest.raises(pb_utils.TritonModelException, match="must be provided"):
        sender.send()
    with pytest.raises(TypeError):
        sender.send("not a response")


def test_bls_request_constructs_and_exec_needs_a_worker():
    tensor = pb_utils.Tensor("IN", np.ones(1))
    request = pb_utils.InferenceRequest(
        model_name="other", requested_output_names=["OUT"], inputs=[tensor],
        parameters={"p": True},
    )
    assert request.inputs() == [tensor] and json.loads(request.parameters()) == {"p": True}
    # Only from execute, as in Triton; outside a worker there is no server to call
    # (tests/e2e/test_bls.py has the calls).
    with pytest.raises(pb_utils.TritonModelException,
                       match="BLS is only supported during the 'execute' function."):
        request.exec()
    pb_utils._allow_bls(True)
    try:
        with pytest.raises(pb_utils.TritonModelException, match="only inside a shmserve worker"):
            request.exec()
    finally:
        pb_utils._allow_bls(False)
    # A name read from a BYTES tensor is the name (pybind11 takes bytes for a string).
    assert pb_utils.InferenceRequest(model_name=b"other", requested_output_names=[],
                                     inputs=[])._model_name == "other"
    with pytest.raises(pb_utils.TritonModelException, match="only inside a shmserve worker"):
        pb_utils.is_model_ready("other")
    with pytest.raises(pb_utils.TritonModelException, match="response sender"):
        request.get_response_sender()
    with pytest.raises(pb_utils.TritonModelException, match="Correlation ID"):
        pb_utils.InferenceRequest(model_name="o", requested_output_names=[], inputs=[],
                                  correlation_id=1.5)


def bls_request(request_id, **inputs):
    return pb_utils.InferenceRequest(
        request_id=request_id, model_name="m", requested_output_names=[],
        inputs=[pb_utils.Tensor(name, value) for name, value in inputs.items()])


def test_batched_input_of_requests_a_model_built():
    first, second = np.arange(6).reshape(2, 3), np.full((1, 3), 9)
    requests = [bls_request("a", X=first), bls_request("b", X=second, Y=np.ones(1))]
    whole = pb_utils.batched_input(requests, "X")
    np.testing.assert_array_equal(whole, np.concatenate([first, second]))
    assert not np.shares_memory(whole, first)
    assert pb_utils.batched_input(requests[:1], "X") is requests[0].inputs()[0].as_numpy()
    strings = [bls_request("a", S=np.array([b"x"], np.object_)),
               bls_request("b", S=np.array([b"yz"], np.object_))]
    assert pb_utils.batched_input(strings, "S").tolist() == [b"x", b"yz"]


def test_batched_input_views_rows_that_lie_back_to_back():
    batch = np.arange(8).reshape(4, 2)
    tensors = [pb_utils.Tensor._wrap("X", batch[start:stop], "INT64")
               for start, stop in [(0, 1), (1, 3), (3, 4)]]
    requests = [bls_request(str(k)) for k in range(3)]
    for request, tensor in zip(requests, tensors):
        request.inputs().append(tensor)
    whole = pb_utils.batched_input(requests, "X")
    assert np.shares_memory(whole, batch) and whole.tolist() == batch.tolist()
    tail = pb_utils.batched_input(requests[1:], "X")
    assert np.shares_memory(tail, batch) and tail.tolist() == batch[1:].tolist()
    out_of_order = pb_utils.batched_input(requests[::-1], "X")
    assert not np.shares_memory(out_of_order, batch)
    assert out_of_order.tolist() == [[6, 7], [2, 3], [4, 5], [0, 1]]
    # Separate allocations are never joined into one view.
    a, b = np.zeros((1, 2)), np.ones((1, 2))
    apart = [bls_request("a", X=a), bls_request("b", X=b)]
    assert pb_utils.batched_input(apart, "X").tolist() == [[0, 0], [1, 1]]
    assert not np.shares_memory(pb_utils.batched_input(apart, "X"), a)


def test_batched_input_errors():
    requests = [bls_request("a", X=np.ones((1, 2))), bls_request("b", Y=np.ones((1, 2)))]
    with pytest.raises(pb_utils.TritonModelException, match="request 'b' has no input 'X'"):
        pb_utils.batched_input(requests, "X")
    with pytest.raises(pb_utils.TritonModelException, match="no requests"):
        pb_utils.batched_input([], "X")
    mismatched = [bls_request("a", X=np.ones((1, 2))), bls_request("b", X=np.ones((1, 3)))]
    with pytest.raises(pb_utils.TritonModelException, match="cannot batch input 'X'"):
        pb_utils.batched_input(mismatched, "X")


def test_load_model_checks_its_files_before_calling():
    with pytest.raises(pb_utils.TritonModelException, match="must start with 'file:'"):
        pb_utils.load_model("m", files={"model.py": b""})
    with pytest.raises(pb_utils.TritonModelException, match="must be bytes"):
        pb_utils.load_model("m", files={"file:1/model.py": "text"})


# --- config helpers and ModelConfig -----------------------------------------------------------

CONFIG = {
    "name": "m",
    "max_batch_size": 8,
    "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}],
}


def test_config_lookup_helpers():
    assert pb_utils.get_input_config_by_name(CONFIG, "IN")["dims"] == [4]
    assert pb_utils.get_output_config_by_name(CONFIG, "OUT")["data_type"] == "TYPE_FP32"
    assert pb_utils.get_input_config_by_name(CONFIG, "OUT") is None
    assert not pb_utils.using_decoupled_model_transaction_policy(CONFIG)
    decoupled = dict(CONFIG, model_transaction_policy={"decoupled": True})
    assert pb_utils.using_decoupled_model_transaction_policy(decoupled)


def test_model_config_completes_an_empty_config():
    config = pb_utils.ModelConfig(json.dumps({"name": "m", "max_batch_size": 0,
                                              "input": [], "output": []}))
    config.set_max_batch_size(4)
    config.set_dynamic_batching()
    config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [-1], "optional": True})
    config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [-1]})
    config.set_model_transaction_policy({"decoupled": False})
    assert config.as_dict() == {
        "name": "m", "max_batch_size": 4, "dynamic_batching": {},
        "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [-1], "optional": True}],
        "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [-1]}],
        "model_transaction_policy": {"decoupled": False},
    }


def test_model_config_fills_a_partial_entry():
    config = pb_utils.ModelConfig(json.dumps(
        {"name": "m", "max_batch_size": 0,
         "input": [{"name": "IN", "data_type": "TYPE_INVALID", "dims": []}], "output": []}))
    config.add_input({"name": "IN", "data_type": "TYPE_FP16", "dims": [2]})
    assert config.as_dict()["input"] == [{"name": "IN", "data_type": "TYPE_FP16", "dims": [2]}]


@pytest.mark.parametrize("edit,message", [
    (lambda c: c.set_max_batch_size(2), "configuration specified max_batch_size 8"),
    (lambda c: c.add_input({"name": "IN", "data_type": "TYPE_INT8", "dims": [4]}),
     "configuration expects datatype TYPE_FP32 for input 'IN', model provides TYPE_INT8"),
    (lambda c: c.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [5]}),
     r"the model expects dims \[5\] but the model configuration specifies dims \[4\]"),
    (lambda c: c.add_input({"name": "X", "data_type": "TYPE_FP32"}), "missing 'dims'"),
    (lambda c: c.add_input({"data_type": "TYPE_FP32", "dims": [1]}), "missing 'name'"),
    (lambda c: c.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [1],
                             "optional": True}),
     "contains property other than 'name', 'data_type' and 'dims'"),
    (lambda c: c.set_model_transaction_policy({"streaming": True}),
     "contains property other than 'decoupled'"),
])
def test_model_config_checks(edit, message):
    with pytest.raises(ValueError, match=message):
        edit(pb_utils.ModelConfig(json.dumps(CONFIG)))


def test_model_config_scheduler_and_decoupled_conflicts():
    sequence = pb_utils.ModelConfig(json.dumps(dict(CONFIG, sequence_batching={})))
    with pytest.raises(ValueError, match="'sequence_batching'"):
        sequence.set_dynamic_batching()
    decoupled = pb_utils.ModelConfig(
        json.dumps(dict(CONFIG, model_transaction_policy={"decoupled": True})))
    with pytest.raises(ValueError, match="already set to 'True'"):
        decoupled.set_model_transaction_policy({"decoupled": False})
    decoupled.set_model_transaction_policy({"decoupled": True})


# --- Logger -----------------------------------------------------------------------------------


def test_logger_keeps_the_level_and_the_models_call_site():
    # The worker's root handler takes the records to the server log (workers/__main__.py).
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger(pb_utils.LOGGER_NAME)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        pb_utils.Logger.log_info("hello")
        pb_utils.Logger.log_warn("careful")
        pb_utils.Logger.log_error("bad")
        pb_utils.Logger.log_verbose("detail")
        pb_utils.Logger.log("default level")
        pb_utils.Logger.log("shown", level=pb_utils.Logger.VERBOSE)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.INFO, "hello"), (logging.WARNING, "careful"), (logging.ERROR, "bad"),
        (logging.DEBUG, "detail"), (logging.INFO, "default level"), (logging.DEBUG, "shown")]
    # The location is the model's call site, not this module.
    assert {r.filename for r in records} == {"test_pb_utils.py"}
    pb_utils._set_model_context(model_dir="/models/m/1")
    assert pb_utils.get_model_dir() == "/models/m/1"


# --- metrics ----------------------------------------------------------------------------------
# Errors as Triton's Python backend words them (src/metric.cc, src/metric_family.cc, and the
# core's messages behind "Failed to process the request for model '<instance>'").

CLEARED = ("Invalid metric operation as the corresponding 'MetricFamily' has been deleted. "
           "The 'MetricFamily' object should be deleted AFTER its corresponding 'Metric' "
           "objects have been deleted.")


def refused(action, message):
    return f"{action}: Failed to process the request for model 'm_0_0', message: {message}"


@pytest.fixture
def metrics(monkeypatch):
    """A process of its own: no family declared yet, instance m_0_0."""
    monkeypatch.setattr(metrics_module, "_registry", {})
    monkeypatch.setattr(CONTEXT, "instance_name", "m_0_0")
    return pb_utils


def raises_exactly(text):
    return pytest.raises(pb_utils.TritonModelException, match=f"^{re.escape(text)}$")


def test_counter_and_gauge(metrics):
    counter = pb_utils.MetricFamily("requests_total", "requests", pb_utils.MetricFamily.COUNTER)
    metric = counter.Metric(labels={"model": "m"})
    metric.increment(2)
    metric.increment(np.float32(1.5))
    assert metric.value() == 3.5 and type(metric.value()) is float
    assert counter.Metric(labels={"model": "m"}) is metric
    assert counter.Metric(labels={"model": "other"}).value() == 0
    with raises_exactly(refused("Failed to increment metric value",
                                "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented "
                                "monotonically by non-negative values.")):
        metric.increment(-1)
    with raises_exactly(refused("Failed to set metric value",
                                "TRITONSERVER_METRIC_KIND_COUNTER does not support Set")):
        metric.set(1)
    with raises_exactly(refused("Failed to observe metric value",
                                "TRITONSERVER_METRIC_KIND_COUNTER does not support Observe")):
        metric.observe(1)
    with pytest.raises(TypeError):
        metric.increment("1")

    gauge_family = pb_utils.MetricFamily("temp", "temperature", pb_utils.MetricFamily.GAUGE)
    gauge = gauge_family.Metric()
    gauge.set(10)
    gauge.increment(-3)
    assert gauge.value() == 7
    with raises_exactly(refused("Failed to observe metric value",
                                "TRITONSERVER_METRIC_KIND_GAUGE does not support Observe")):
        gauge.observe(1)


def test_histogram(metrics):
    family = pb_utils.MetricFamily("latency", "latency", pb_utils.MetricFamily.HISTOGRAM)
    histogram = family.Metric(labels={}, buckets=[1, 5])
    for value in (0.5, 1, 3, 7):
        histogram.observe(value)
    _, families = pb_utils._metrics_snapshot()
    assert families == [["latency", "latency", 2, [[{}, [[1.0, 5.0], [2, 1, 1], 11.5, 4],
                                                    families[0][3][0][2]]]]]
    with raises_exactly(refused("Failed to get metric value",
                                "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value")):
        histogram.value()
    with raises_exactly(refused("Failed to increment metric value",
                                "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment")):
        histogram.increment(1)
    with raises_exactly(refused("Failed to set metric value",
                                "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Set")):
        histogram.set(1)
    only_inf = family.Metric(labels={"empty": "yes"}, buckets=[])  # one bucket: +Inf
    only_inf.observe(3)
    assert only_inf._series.counts == [1]


def test_invalid_buckets_and_labels(metrics):
    """Triton's QA model custom_metrics (test_histogram_args) and the stub's checks."""
    family = pb_utils.MetricFamily("h", "h", pb_utils.MetricFamily.HISTOGRAM)
    for no_buckets in ({"labels": {}}, {"labels": {}, "buckets": None}):
        with raises_exactly("Failed to create metric. Missing required buckets."):
            family.Metric(**no_buckets)
    for unsorted in ([2.5, 0.1, 1.0, 10.0, 5.0], [1, 1, 2, 5, 5]):
        with raises_exactly(refused("Error when creating Metric",
                                    "Bucket Boundaries must be strictly sorted")):
            family.Metric(labels={}, buckets=unsorted)
    with raises_exactly("Failed to create metric. Buckets must be a list."):
        family.Metric(labels={}, buckets=(1, 2))
    with raises_exactly("Failed to create metric. Labels must be a dictionary."):
        family.Metric(labels=[("a", "b")], buckets=[1])
    with pytest.raises(pb_utils.TritonModelException, match="labels"):
        family.Metric(labels={"a": 1}, buckets=[1])
    for kind in (pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE):
        other = pb_utils.MetricFamily(f"k{int(kind)}", "k", kind)
        with raises_exactly("Failed to create metric. Unexpected buckets found."):
            other.Metric(buckets=[1])
    # A failed creation leaves no series behind.
    assert pb_utils._metrics_snapshot()[1] == []


def test_a_metric_is_unusable_once_its_family_is_deleted(metrics):
    for kind in (pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE,
                 pb_utils.MetricFamily.HISTOGRAM):
        family = pb_utils.MetricFamily(f"life{int(kind)}", "lifetime", kind)
        metric = family.Metric(labels={"a": "b"},
                               buckets=[1] if kind == pb_utils.MetricFamily.HISTOGRAM else None)
        del family
        for call, action in ((lambda metric=metric: metric.increment(10), "increment"),
                             (lambda metric=metric: metric.set(10), "set"),
                             (lambda metric=metric: metric.observe(10), "observe"),
                             (metric.value, "get")):
            with raises_exactly(f"Failed to {action} metric value: {CLEARED}"):
                call()
    assert pb_utils._metrics_snapshot()[1] == []  # and their series are gone


def test_a_redeclared_family_is_the_same_family(metrics):
    """As Triton's registry merges them: the first description stays, series are shared, and
    a series goes with the last family object holding a metric of it."""
    first = pb_utils.MetricFamily("dup", "first description", pb_utils.MetricFamily.COUNTER)
    second = pb_utils.MetricFamily("dup", "second description", pb_utils.MetricFamily.COUNTER)
    first.Metric(labels={"k": "1"}).increment(2)
    assert second.Metric(labels={"k": "1"}).value() == 2
    second.Metric(labels={"k": "2"})
    del first
    (family,) = pb_utils._metrics_snapshot()[1]
    assert family[:3] == ["dup", "first description", 0]
    assert sorted(s[0]["k"] for s in family[3]) == ["1", "2"]
    del second
    assert pb_utils._metrics_snapshot()[1] == []
    again = pb_utils.MetricFamily("dup", "third", pb_utils.MetricFamily.COUNTER)
    assert again.Metric(labels={"k": "1"}).value() == 0  # a new series
    assert pb_utils._metrics_snapshot()[1][0][1] == "first description"


def test_a_family_name_keeps_its_kind(metrics):
    counter = pb_utils.MetricFamily("clash", "c", pb_utils.MetricFamily.COUNTER)
    for kind in (pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.HISTOGRAM):
        with raises_exactly(refused("Error when creating MetricFamily",
                                    "Family name already exists with different type")):
            pb_utils.MetricFamily("clash", "c", kind)
    del counter  # the name stays in the registry, with its kind
    with raises_exactly(refused("Error when creating MetricFamily",
                                "Family name already exists with different type")):
        pb_utils.MetricFamily("clash", "c", pb_utils.MetricFamily.GAUGE)


def test_a_new_family_is_declared_to_the_front(metrics, monkeypatch):
    """The front keeps the server's names (another model's family may hold one)."""
    calls = []

    def control(kind, args):
        calls.append((kind, args))
        if args["name"] == "taken":
            raise pb_utils.TritonModelException("Family name already exists with different type")

    monkeypatch.setattr(CONTEXT, "server_calls", object())
    monkeypatch.setattr(metrics_module, "_control", control)
    pb_utils.MetricFamily("mine", "d", pb_utils.MetricFamily.GAUGE)
    pb_utils.MetricFamily("mine", "d", pb_utils.MetricFamily.GAUGE)  # known here: no call
    assert calls == [("metric_family", {"name": "mine", "description": "d", "kind": 1})]
    with raises_exactly(refused("Error when creating MetricFamily",
                                "Family name already exists with different type")):
        pb_utils.MetricFamily("taken", "d", pb_utils.MetricFamily.GAUGE)
    assert "taken" not in metrics_module._registry


def test_snapshots_resend_only_after_a_change(metrics):
    family = pb_utils.MetricFamily("s", "s", pb_utils.MetricFamily.GAUGE)
    metric = family.Metric()
    changes, families = pb_utils._metrics_snapshot()
    assert families[0][3][0][1] == 0.0
    assert pb_utils._metrics_snapshot(changes) == (changes, None)
    metric.set(4)
    changes, families = pb_utils._metrics_snapshot(changes)
    assert families[0][3][0][1] == 4.0


# Argument checks with the exception types Triton's Python backend raises (pybind11's
# TypeError for an argument of the wrong type, TritonModelException for the stub's own
# checks); read off Triton's QA model argument_validation.
_TENSOR = pb_utils.Tensor("INPUT0", np.asarray([1, 2], dtype=np.int32))
_REQUEST = dict(inputs=[_TENSOR], model_name="m", requested_output_names=["o"])


_REFUSED = {
    "request inputs [None]": (lambda: pb_utils.InferenceRequest(**{**_REQUEST, "inputs": [None]}),
                              pb_utils.TritonModelException),
    "request inputs None": (lambda: pb_utils.InferenceRequest(**{**_REQUEST, "inputs": None}),
                            TypeError),
    "request model_name None": (
        lambda: pb_utils.InferenceRequest(**{**_REQUEST, "model_name": None}), TypeError),
    "request outputs [None]": (lambda: pb_utils.InferenceRequest(
        **{**_REQUEST, "requested_output_names": [None]}), TypeError),
    "request outputs None": (lambda: pb_utils.InferenceRequest(
        **{**_REQUEST, "requested_output_names": None}), TypeError),
    "correlation_id None": (lambda: pb_utils.InferenceRequest(**_REQUEST, correlation_id=None),
                            TypeError),
    "correlation_id 1.5": (lambda: pb_utils.InferenceRequest(**_REQUEST, correlation_id=1.5),
                           pb_utils.TritonModelException),
    "request_id None": (lambda: pb_utils.InferenceRequest(**_REQUEST, request_id=None),
                        TypeError),
    "model_version None": (lambda: pb_utils.InferenceRequest(**_REQUEST, model_version=None),
                           TypeError),
    "flags None": (lambda: pb_utils.InferenceRequest(**_REQUEST, flags=None), TypeError),
    "response [None]": (lambda: pb_utils.InferenceResponse(output_tensors=[None]),
                        pb_utils.TritonModelException),
    "response None": (lambda: pb_utils.InferenceResponse(output_tensors=None), TypeError),
    "tensor name None": (lambda: pb_utils.Tensor(None, np.ones(2)), TypeError),
    "tensor array None": (lambda: pb_utils.Tensor("OUTPUT0", None), TypeError),
    "tensor '' None": (lambda: pb_utils.Tensor("", None), TypeError),
    "from_dlpack None": (lambda: pb_utils.Tensor.from_dlpack("OUTPUT0", None),
                         pb_utils.TritonModelException),
    "from_dlpack '' None": (lambda: pb_utils.Tensor.from_dlpack("", None),
                            pb_utils.TritonModelException),
    "log level None": (lambda: pb_utils.Logger.log("Invalid Level", None), TypeError),
    "log level 1": (lambda: pb_utils.Logger.log("Invalid Level", 1), TypeError),
    "log_info None": (lambda: pb_utils.Logger.log_info(None), TypeError),
    "log_warn None": (lambda: pb_utils.Logger.log_warn(None), TypeError),
    "log_error None": (lambda: pb_utils.Logger.log_error(None), TypeError),
    "log_verbose None": (lambda: pb_utils.Logger.log_verbose(None), TypeError),
}


@pytest.mark.parametrize("case", sorted(_REFUSED))
def test_arguments_are_refused_with_tritons_exception_types(case):
    make, raised = _REFUSED[case]
    with pytest.raises(raised):
        make()


def test_arguments_triton_takes():
    assert pb_utils.InferenceRequest(**_REQUEST, correlation_id=5).correlation_id() == 5
    assert pb_utils.InferenceRequest(**_REQUEST, correlation_id="a-5").correlation_id() == "a-5"
    assert pb_utils.InferenceRequest(**_REQUEST).correlation_id() == 0
    pb_utils.InferenceRequest(requested_output_names=[], inputs=[], model_name="m")
    pb_utils.InferenceResponse(output_tensors=[])
    pb_utils.InferenceResponse([_TENSOR])
    pb_utils.Logger.log("Level unspecified")
