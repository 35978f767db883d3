"""Our `triton_python_backend_utils`: InferenceResponse and TritonError, an incoming
InferenceRequest with its trace, cancellation and response sender, BLS requests and load_model
outside a worker, batched_input over requests, and the arguments refused or taken with the
exception types Triton's Python backend raises."""

import json

import numpy as np
import pytest

import workers.triton_python_backend_utils as pb_utils


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


# --- argument checks --------------------------------------------------------------------------


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
