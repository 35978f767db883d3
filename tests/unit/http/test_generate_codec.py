"""HTTP generate codec: flat JSON keys mapped onto a model's signature, and back."""

import numpy as np
import orjson
import pytest

from shmserve.errors import Code, ServerError
from shmserve.http.generate import (
    decode_generate_request,
    encode_generate_response,
    sse_data,
    sse_error,
)
from shmserve.inference import InferResponse, OutputTensor
from shmserve.ipc import datatypes
from shmserve.signature import ModelSignature, TensorSpec

VALUES = {
    "BOOL": [True, False, True],
    "UINT8": [0, 7, 255],
    "UINT16": [0, 7, 65535],
    "UINT32": [0, 7, 2**32 - 1],
    "UINT64": [0, 7, 2**64 - 1],
    "INT8": [-128, 0, 127],
    "INT16": [-32768, 0, 32767],
    "INT32": [-(2**31), 0, 2**31 - 1],
    "INT64": [-(2**63), 0, 2**63 - 1],
    "FP32": [0.5, -2.25, 1e-30],
    "FP64": [0.1, -2.5, 1e300],
    "BYTES": ["abc", "", "h\u00e9llo \u2603"],
}


def signature(inputs=None, outputs=None, max_batch_size=0):
    """inputs/outputs: name -> (datatype, dims)."""

    def specs(items):
        return {n: TensorSpec(n, dt, tuple(dims), None) for n, (dt, dims) in (items or {}).items()}

    return ModelSignature(max_batch_size, specs(inputs), specs(outputs))


def decode(doc, sig, raw=None):
    body = raw if raw is not None else orjson.dumps(doc)
    return decode_generate_request(body, "m", "1", sig)


def rejects(doc, sig, *fragments, raw=None):
    with pytest.raises(ServerError) as err:
        decode(doc, sig, raw)
    assert err.value.code is Code.INVALID_ARG
    for fragment in fragments:
        assert fragment in err.value.message
    return err.value.message


def encode(outputs=(), parameters=None, id=""):
    response = InferResponse("m", "1", id, parameters or {}, list(outputs))
    return orjson.loads(encode_generate_response(response))


def wire(datatype, values):
    if datatype == "BYTES":
        return datatypes.serialize_bytes(values)
    return np.array(values, dtype=datatypes.numpy_dtype(datatype)).tobytes()


@pytest.mark.parametrize("datatype", VALUES)
def test_every_json_datatype_round_trips(datatype):
    values = VALUES[datatype]
    sig = signature({"x": (datatype, [-1])})
    request = decode({"x": values}, sig)

    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", datatype, [3])
    assert bytes(tensor.data) == wire(datatype, values)

    out = OutputTensor("y", datatype, tensor.shape, tensor.data)
    if datatype == "FP32":  # written as Triton writes them: the doubles they are exactly
        values = [float(np.float32(v)) for v in values]
    assert encode([out])["y"] == values


def test_non_finite_floats_are_written_as_triton_writes_them():
    # orjson would write null; tritonclient-style readers (Python's json) take these tokens.
    response = InferResponse("m", "1", "", {}, [
        OutputTensor("one", "FP32", [1], wire("FP32", [float("nan")])),
        OutputTensor("many", "FP64", [3], wire("FP64", [float("-inf"), 1.5, float("inf")]))])
    body = encode_generate_response(response)
    assert b'"one":NaN' in body and b'"many":[-Infinity,1.5,Infinity]' in body
    assert decode(None, signature({"x": ("FP32", [-1])}),
                  raw=b'{"x": [NaN, -Infinity]}').inputs[0].data.tobytes() == \
        wire("FP32", [float("nan"), float("-inf")])


def test_request_basics():
    request = decode({"text_input": "hi"}, signature({"text_input": ("BYTES", [1])}))
    assert (request.model_name, request.model_version, request.id) == ("m", "1", "")
    assert request.parameters == {}
    assert request.outputs == []  # every output of the model


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_inputs_are_refused(datatype):
    rejects({"x": [1.0]}, signature({"x": (datatype, [-1])}), "via JSON is not supported")


@pytest.mark.parametrize(
    "datatype, value, fragment",
    [
        ("INT32", 1.5, "expected INT32 values"),
        ("INT32", "1", "expected INT32 values"),
        ("INT32", True, "expected INT32 values"),
        ("UINT8", 256, "out of range"),
        ("FP32", True, "expected FP32 values"),
        ("BOOL", 1, "expected BOOL values"),
        ("BYTES", 5, "expected BYTES as JSON strings"),
        ("FP32", None, "expected FP32 values"),
    ],
)
def test_values_must_fit_the_datatype(datatype, value, fragment):
    rejects({"x": value}, signature({"x": (datatype, [-1])}), "'x'", fragment)


@pytest.mark.parametrize(
    "dims, value, shape",
    [
        ([1], 7, [1]),
        ([-1], 7, [1]),
        ([-1], [1, 2, 3], [3]),
        ([-1], [], [0]),
        ([2, 3], [1, 2, 3, 4, 5, 6], [2, 3]),
        ([-1, 4], list(range(8)), [2, 4]),
        ([-1, -1], list(range(5)), [1, 5]),
        ([2, -1, -1], list(range(6)), [2, 1, 3]),
        ([], 7, []),
    ],
)
def test_shape_comes_from_the_config_dims(dims, value, shape):
    (tensor,) = decode({"x": value}, signature({"x": ("INT32", dims)})).inputs
    assert tensor.shape == shape
    assert bytes(tensor.data) == np.array(value, np.int32).tobytes()


@pytest.mark.parametrize(
    "dims, value",
    [([2, 3], [1, 2, 3, 4, 5]), ([1], [1, 2]), ([-1, 3], list(range(7))), ([3], 1), ([0, -1], [1])],
)
def test_element_count_must_fit_the_dims(dims, value):
    rejects({"x": value}, signature({"x": ("INT32", dims)}),
            "The schema can not convert input 'x' to tensor with proper shape")


def test_batching_model_gets_a_batch_of_one():
    sig = signature({"x": ("FP32", [-1]), "s": ("BYTES", [1])}, max_batch_size=8)
    x, s = decode({"x": [1.0, 2.0], "s": "a"}, sig).inputs
    assert (x.shape, s.shape) == ([1, 2], [1, 1])


@pytest.mark.parametrize("value", [[[1, 2], [3, 4]], [1, [2, 3]], [["a"]]])
def test_nested_arrays_are_refused(value):
    rejects({"x": value}, signature({"x": ("INT32", [-1])}), "'x'")


def test_keys_are_inputs_or_parameters_at_both_levels():
    sig = signature({"text_input": ("BYTES", [1]), "max_tokens": ("INT32", [1])})
    request = decode(
        {
            "text_input": "hello",
            "stream": True,
            "parameters": {"max_tokens": 16, "temperature": 0.5, "stop": "\n", "seed": 3},
        },
        sig,
    )
    inputs = {t.name: t for t in request.inputs}
    assert set(inputs) == {"text_input", "max_tokens"}
    assert datatypes.deserialize_bytes(inputs["text_input"].data) == [b"hello"]
    assert bytes(inputs["max_tokens"].data) == np.int32(16).tobytes()
    assert request.parameters == {"stream": True, "temperature": 0.5, "stop": "\n", "seed": 3}


# Triton's words for what follows are in tests/models/README.md ("HTTP generate").
ALREADY = "[request id: <id_unknown>] input 'x' already exists in request"
NESTED = "Converting keyword: 'parameters': "


@pytest.mark.parametrize("raw, message", [
    (b'{"x":1,"x":2}', ALREADY),
    (b'{"x":1,"x":[[2]]}', ALREADY),  # the first value is read again, as in Triton
    (b'{"x":1,"\\u0078":2}', ALREADY),  # the same key, escaped
    (b'{"id":"r1","x":1,"x":2}', "[request id: r1] input 'x' already exists in request"),
    (b'{"x":1,"parameters":{"x":2}}', NESTED + ALREADY),
    (b'{"parameters":{"x":1,"x":2}}', NESTED + ALREADY),
    (b'{"parameters":{"x":1},"x":2}', ALREADY),  # nested first: the top-level one fails
    (b'{"parameters":{"x":1},"parameters":{}}', NESTED + ALREADY),  # the first, twice
])
def test_an_input_given_twice_is_refused_as_triton_refuses_it(raw, message):
    sig = signature({"x": ("INT32", [-1])})
    assert rejects(None, sig, raw=raw) == message


@pytest.mark.parametrize("raw, parameters", [
    (b'{"p":1,"p":2}', {"p": 1}),  # Triton sets p twice, to the first value each time
    (b'{"p":1,"p":[2]}', {"p": 1}),  # so the second value is never read
    (b'{"p":1,"parameters":{"p":2}}', {"p": 2}),  # the last one set, as a model reads it
    (b'{"parameters":{"p":2},"p":1}', {"p": 1}),
    (b'{"parameters":{"p":1,"p":2}}', {"p": 1}),
    (b'{"parameters":{"a":1},"parameters":{"b":2}}', {"a": 1}),
    (b'{"parameters":{"a":1},"parameters":3}', {"a": 1}),
    (b'{"p":"a\\n","p":"b"}', {"p": "a\n"}),
])
def test_a_parameter_given_twice_is_set_as_triton_sets_it(raw, parameters):
    request = decode(None, signature({"x": ("INT32", [-1])}), raw=raw)
    assert request.parameters == parameters


def test_repeated_keys_are_read_in_order():
    sig = signature({"x": ("INT32", [-1])})
    # The first listing is the one read: a bad first value fails, a bad second is unread.
    assert "invalid type" in rejects(None, sig, raw=b'{"p":[1],"p":2}')
    assert rejects(None, sig, raw=b'{"parameters":3,"parameters":{}}').startswith(
        "Expected JSON object for keyword: 'parameters'")
    # A nested value is read before the input is found to be there already.
    message = rejects(None, sig, raw=b'{"x":1,"parameters":{"x":"a"}}')
    assert message.startswith(NESTED + "Unable to parse 'data' of input 'x'")


def test_id_twice_is_the_first():
    request = decode(None, signature({"x": ("INT32", [-1])}), raw=b'{"id":"a","id":5,"x":1}')
    assert (request.id, request.parameters) == ("a", {"id": "a"})
    rejects(None, signature(), "Unable to parse 'id'", raw=b'{"id":5,"id":"a"}')


def test_a_body_without_repeated_keys_is_read_once():
    # No escapes, and no key's quoted text twice: the fast parse is the document.
    body = b'{"x":[1,2],"parameters":{"p":"x"},"q":"p"}'
    request = decode(None, signature({"x": ("INT32", [-1])}), raw=body)
    assert request.parameters == {"p": "x", "q": "p"}
    assert bytes(request.inputs[0].data) == np.array([1, 2], np.int32).tobytes()


def test_many_keys_are_read_as_listed():
    # More keys than are searched for one by one: parsed again, with every listing.
    body = b"{" + b",".join(b'"k%d":%d' % (i % 20, i) for i in range(40)) + b"}"
    request = decode(None, signature(), raw=body)
    assert request.parameters == {f"k{i}": i for i in range(20)}


def test_id_is_also_a_parameter_or_an_input():
    assert decode({"id": "r", "x": 1}, signature({"x": ("INT32", [1])})).parameters == {"id": "r"}
    request = decode({"id": "r"}, signature({"id": ("BYTES", [1])}))
    assert request.id == "r" and request.parameters == {}
    assert datatypes.deserialize_bytes(request.inputs[0].data) == [b"r"]


def test_parameters_must_be_an_object():
    for value in ([1], "x", None, 3):
        assert rejects({"parameters": value}, signature()) == (
            "Expected JSON object for keyword: 'parameters': attempt to access JSON "
            "non-object as object")


def test_an_input_named_parameters_cannot_be_given():
    sig = signature({"parameters": ("INT32", [-1])})
    for value in ([1], {"a": 1}):
        assert rejects({"parameters": value}, sig) == (
            "Keyword 'parameters' for nested schema also given as input tensor name")
    assert decode({}, sig).inputs == []


def test_errors_in_parameters_name_it():
    sig = signature({"x": ("INT32", [2])})
    assert rejects({"parameters": {"x": [1]}}, sig) == (
        NESTED + "The schema can not convert input 'x' to tensor with proper shape")
    assert rejects({"parameters": {"parameters": {}}}, sig).startswith(
        NESTED + "parameter 'parameters' has invalid type")


def test_id():
    assert decode({"id": "req-7"}, signature()).id == "req-7"
    rejects({"id": 7}, signature(), "Unable to parse 'id'")


@pytest.mark.parametrize("doc", [{"triton_x": 1}, {"parameters": {"triton_enable": True}}])
def test_triton_prefixed_parameters_are_refused(doc):
    rejects(doc, signature(), "reserved for Triton usage")


@pytest.mark.parametrize("value", [[1, 2], {"a": 1}, None])
@pytest.mark.parametrize("nested", [False, True])
def test_parameters_must_be_scalars(value, nested):
    doc = {"parameters": {"p": value}} if nested else {"p": value}
    message = rejects(doc, signature({"x": ("INT32", [-1])}))
    assert message == (NESTED if nested else "") + (
        "parameter 'p' has invalid type. It should be either 'int', 'bool', or 'string'.")


@pytest.mark.parametrize("raw", [b"{", b"", b"not json", b'{"a":1}x'])
def test_malformed_json_is_refused(raw):
    rejects(None, signature(), "failed to parse the request JSON buffer", raw=raw)


@pytest.mark.parametrize("raw", [b"[]", b'"text"', b"3", b"null"])
def test_body_must_be_an_object(raw):
    assert rejects(None, signature(), raw=raw) == "attempt to get members for non-object"


def test_a_body_nested_deeper_than_pythons_parser_goes():
    # orjson reads it; json (for the repeated key) cannot: a value nested so deep fails anyway.
    raw = b'{"x":1,"x":' + b"[" * 1000 + b"]" * 1000 + b"}"
    assert rejects(None, signature({"x": ("INT32", [-1])}), raw=raw)


def test_body_may_be_a_memoryview():
    request = decode(None, signature({"x": ("INT32", [1])}), raw=memoryview(b'{"x":[4]}'))
    assert bytes(request.inputs[0].data) == np.int32(4).tobytes()


def test_response_layout():
    doc = encode(
        [OutputTensor("text_output", "BYTES", [1], wire("BYTES", ["out"]))],
        parameters={"finish_reason": "stop", "tokens": 3, "final": True},
        id="req-7",
    )
    assert doc == {
        "id": "req-7",
        "model_name": "m",
        "model_version": "1",
        "text_output": "out",
        "finish_reason": "stop",
        "tokens": 3,
        "final": True,
    }
    assert "id" not in encode()


def test_outputs_and_parameters_never_replace_the_fixed_keys():
    doc = encode(
        [
            OutputTensor("model_name", "INT32", [1], wire("INT32", [1])),
            OutputTensor("x", "INT32", [1], wire("INT32", [2])),
        ],
        parameters={"model_version": "9", "x": "param", "id": "p"},
    )
    assert doc == {"model_name": "m", "model_version": "1", "x": 2}


@pytest.mark.parametrize(
    "shape, values, expected",
    [([1], [0.1], float(np.float32(0.1))), ([1, 1], [3.0], 3.0), ([], [2.5], 2.5), ([2], [1.0, 2.0], [1.0, 2.0]),
     ([1, 2], [1.0, 2.0], [1.0, 2.0]), ([0], [], [])],
)
def test_single_element_outputs_are_unwrapped(shape, values, expected):
    out = OutputTensor("y", "FP32", shape, wire("FP32", values))
    assert encode([out])["y"] == expected


def test_unwrapped_scalars_of_other_types():
    outputs = [
        OutputTensor("b", "BOOL", [1], b"\x01"),
        OutputTensor("s", "BYTES", [1, 1], wire("BYTES", ["one"])),
        OutputTensor("u", "UINT64", [1], wire("UINT64", [2**64 - 1])),
    ]
    assert encode(outputs) == {"model_name": "m", "model_version": "1", "b": True, "s": "one",
                               "u": 2**64 - 1}


def test_output_data_may_be_a_typed_memoryview():
    data = memoryview(np.array([[1.5, 2.5]], np.float64))
    assert encode([OutputTensor("y", "FP64", [1, 2], data)])["y"] == [1.5, 2.5]


def test_bytes_outputs_that_are_not_utf8_get_replacement_characters():
    out = OutputTensor("t", "BYTES", [2], wire("BYTES", [b"ok\xff", "\u00e9".encode()[:1]]))
    assert encode([out])["t"] == ["ok\ufffd", "\ufffd"]


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_outputs_are_refused(datatype):
    with pytest.raises(ServerError) as err:
        encode([OutputTensor("y", datatype, [1], b"\x00\x3c")])
    assert err.value.code is Code.INVALID_ARG
    assert "'y'" in err.value.message


@pytest.mark.parametrize(
    "datatype, shape, data",
    [("FP32", [2], b"\x00" * 4), ("BOOL", [3], b"\x01"), ("BYTES", [2], wire("BYTES", ["a"])),
     ("BYTES", [1], b"\x05\x00\x00\x00ab")],
)
def test_output_size_mismatch_is_internal(datatype, shape, data):
    with pytest.raises(ServerError) as err:
        encode([OutputTensor("y", datatype, shape, data)])
    assert err.value.code is Code.INTERNAL


def test_sse_data_frames_one_event():
    assert sse_data(b'{"a":1}') == b'data: {"a":1}\n\n'


def test_sse_error_escapes_the_message():
    message = 'bad "quote"\nsecond line\r\n\\ \u00e9'
    event = sse_error(message)
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    payload = event[len(b"data: "):-2]
    assert b"\n" not in payload and b"\r" not in payload
    assert orjson.loads(payload) == {"error": message}


def test_streamed_response_is_one_event():
    out = OutputTensor("text_output", "BYTES", [1], wire("BYTES", ["line one\nline two"]))
    response = InferResponse("m", "1", outputs=[out])
    event = sse_data(encode_generate_response(response))
    assert event.count(b"\n\n") == 1 and event.endswith(b"\n\n")
    assert orjson.loads(event[len(b"data: "):])["text_output"] == "line one\nline two"
