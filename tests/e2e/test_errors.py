"""Bad input gets Triton's status and message, and the server goes on serving."""

import re
import urllib.error
import urllib.request

import grpc
import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

HTTP_STATUS = {"INVALID_ARG": "400", "NOT_FOUND": "404", "INTERNAL": "500"}
GRPC_STATUS = {"INVALID_ARG": "StatusCode.INVALID_ARGUMENT", "NOT_FOUND": "StatusCode.NOT_FOUND",
               "INTERNAL": "StatusCode.INTERNAL"}


def _mod(protocol):
    return httpclient if protocol == "http" else grpcclient


def _inp(protocol, name, arr, dtype=None):
    mod = _mod(protocol)
    inp = mod.InferInput(name, list(arr.shape), dtype or "FP32")
    inp.set_data_from_numpy(arr)
    return inp


def _still_serving(client, protocol):
    a = np.ones(4, np.float32)
    r = client.infer("add_sub", [_inp(protocol, "INPUT0", a), _inp(protocol, "INPUT1", a)])
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a * 2)


def _expect(client, protocol, code, fragment, model, inputs, **kw):
    with pytest.raises(InferenceServerException) as e:
        client.infer(model, inputs, **kw)
    status = HTTP_STATUS[code] if protocol == "http" else GRPC_STATUS[code]
    assert e.value.status() == status, e.value.message()
    assert fragment in e.value.message()
    _still_serving(client, protocol)
    return e.value.message()


F4 = np.ones(4, np.float32)

CASES = {
    "unknown model": ("NOT_FOUND", "Request for unknown model: 'nope' is not found", "nope",
                      lambda p: [_inp(p, "INPUT0", F4)], {}),
    "unknown version": ("NOT_FOUND", "version 9 is not found", "add_sub",
                        lambda p: [_inp(p, "INPUT0", F4), _inp(p, "INPUT1", F4)],
                        {"model_version": "9"}),
    "missing input": ("INVALID_ARG", "missing required input(s) ['INPUT1']", "add_sub",
                      lambda p: [_inp(p, "INPUT0", F4)], {}),
    "missing input, some optional": ("INVALID_ARG", "missing required input(s) ['INPUT0']",
                                     "batch_recorder",
                                     lambda p: [_inp(p, "DELAY", np.zeros((1, 1), np.float32))], {}),
    "extra input": ("INVALID_ARG", "unexpected inference input 'INPUT9' for model 'add_sub'", "add_sub",
                    lambda p: [_inp(p, "INPUT0", F4), _inp(p, "INPUT1", F4), _inp(p, "INPUT9", F4)], {}),
    "wrong datatype": ("INVALID_ARG", "data-type is 'INT32', but model 'add_sub' expects 'FP32'", "add_sub",
                       lambda p: [_inp(p, "INPUT0", np.ones(4, np.int32), "INT32"), _inp(p, "INPUT1", F4)], {}),
    "wrong shape": ("INVALID_ARG", "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [4], got [5]",
                    "add_sub", lambda p: [_inp(p, "INPUT0", np.ones(5, np.float32)), _inp(p, "INPUT1", F4)], {}),
    "no batch dimension": ("INVALID_ARG", "Expected [-1,-1], got [4]. NOTE: Setting a non-zero "
                           "max_batch_size in the model config requires a batch dimension",
                           "identity_fp32", lambda p: [_inp(p, "INPUT0", F4)], {}),
    "no shape": ("INVALID_ARG", "input 'INPUT0' has no shape but model requires batch dimension "
                 "for 'identity_fp32'", "identity_fp32",
                 lambda p: [_inp(p, "INPUT0", np.array(1, np.float32))], {}),
    "batch too large": ("INVALID_ARG", "inference request batch-size must be <= 64 for 'identity_fp32'",
                        "identity_fp32", lambda p: [_inp(p, "INPUT0", np.ones((65, 2), np.float32))], {}),
    "batch of 0": ("INVALID_ARG", "inference request batch-size must be >= 1 for 'identity_fp32'",
                   "identity_fp32", lambda p: [_inp(p, "INPUT0", np.ones((0, 2), np.float32))], {}),
    "unknown output": ("INVALID_ARG", "unexpected inference output 'OUTPUT7' for model 'add_sub'", "add_sub",
                       lambda p: [_inp(p, "INPUT0", F4), _inp(p, "INPUT1", F4)],
                       {"outputs": "OUTPUT7"}),
    "model raises": ("INTERNAL", "raiser always fails", "raiser",
                     lambda p: [_inp(p, "INPUT0", F4)], {}),
    "model error response": ("INVALID_ARG", "bad thing", "error_response",
                             lambda p: [_inp(p, "INPUT0", F4)], {}),
}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("case", list(CASES))
def test_bad_request(clients, protocol, case):
    code, fragment, model, inputs, kw = CASES[case]
    if "outputs" in kw:
        kw = dict(kw, outputs=[_mod(protocol).InferRequestedOutput(kw["outputs"])])
    msg = _expect(clients[protocol], protocol, code, fragment, model, inputs(protocol), **kw)
    if case == "model raises":
        assert msg.startswith("Failed to process the request(s) for model")
        assert "raiser_0_0" in msg
        # Then, as Triton's Python backend adds it, where in the model it was raised.
        assert re.search(r"raiser always fails\n\nAt:\n  \S+/raiser/1/model\.py\(\d+\): execute\n$",
                         msg), msg
    if case in EXACT:
        assert msg == EXACT[case]


# Whole messages, as Triton 2.51 words them: it names the request only in the errors of its
# validation against the model, not in those it finds while reading the request.
EXACT = {
    "missing input": "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model "
                     "'add_sub'. Got input(s) ['INPUT0'], but missing required input(s) "
                     "['INPUT1']. Please provide all required input(s).",
    "missing input, some optional": "[request id: <id_unknown>] expected number of inputs "
                                    "between 1 and 2 but got 1 inputs for model "
                                    "'batch_recorder'. Got input(s) ['DELAY'], but missing "
                                    "required input(s) ['INPUT0']. Please provide all required "
                                    "input(s).",
    "extra input": "unexpected inference input 'INPUT9' for model 'add_sub'",
    "unknown output": "unexpected inference output 'OUTPUT7' for model 'add_sub'",
    "wrong shape": "[request id: <id_unknown>] unexpected shape for input 'INPUT0' for model "
                   "'add_sub'. Expected [4], got [5]. ",
}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_statistics_of_an_unknown_model_is_invalid_arg(clients, protocol):
    # Triton answers INVALID_ARG here, where its other model APIs answer NOT_FOUND.
    client = clients[protocol]
    for args, message in ((("nope",), "requested model 'nope' is not available"),
                          (("add_sub", "9"), "requested model version is not available for "
                                             "model 'add_sub'")):
        with pytest.raises(InferenceServerException) as e:
            client.get_inference_statistics(*args)
        status = HTTP_STATUS if protocol == "http" else GRPC_STATUS
        assert e.value.status() == status["INVALID_ARG"]
        assert e.value.message() == message
    assert client.get_inference_statistics("add_sub", "1")


def test_http_json_carries_nan_and_infinities(server, clients):
    # tritonclient writes them as Python's json does (NaN, Infinity, -Infinity) and reads them
    # back; Triton's JSON parser and writer both accept them.
    values = np.array([[np.nan, np.inf, -np.inf, 1.5]], np.float32)
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(values, binary_data=False)
    result = clients["http"].infer("identity_fp32", [tensor], outputs=[
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)
    body = result.get_response()
    assert body["outputs"][0]["data"][1:] == [float("inf"), float("-inf"), 1.5]


def test_sequence_flags_must_be_booleans(server, clients):
    # tritonclient refuses to send these as custom parameters, so the body is written here.
    body = (b'{"parameters":{"sequence_start":"yes"},"inputs":['
            b'{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,2,3,4]},'
            b'{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,2,3,4]}]}')
    status, out = _post(server, "/v2/models/add_sub/infer", body)
    assert (status, out) == (400, b'{"error":"invalid value type for \'sequence_start\' '
                                  b'parameter, expected bool_param."}')
    _still_serving(clients["http"], "http")


def test_http_json_true_is_not_a_number(server, clients):
    body = (b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,2,3,true]},'
            b'{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,2,3,4]}]}')
    status, out = _post(server, "/v2/models/add_sub/infer", body)
    assert status == 400 and b"expected FP32 values" in out, out
    _still_serving(clients["http"], "http")


def test_batch_error_names_the_request(clients):
    with pytest.raises(InferenceServerException) as e:
        clients["http"].infer("identity_fp32", [_inp("http", "INPUT0", np.ones((65, 2), np.float32))])
    assert e.value.message().startswith("[request id: <id_unknown>] inference request batch-size")


def _post(server, path, body: bytes, headers=None):
    req = urllib.request.Request(f"http://{server.http_url}{path}", data=body, method="POST",
                                 headers=headers or {})
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_http_malformed_json(server, clients):
    status, body = _post(server, "/v2/models/add_sub/infer", b"{not json")
    assert status == 400 and b"error" in body
    _still_serving(clients["http"], "http")


def test_http_bad_binary_header(server, clients):
    for value in ("abc", "-1", "999999", "1_0", "+2"):
        status, body = _post(server, "/v2/models/add_sub/infer", b"{}",
                             {"Inference-Header-Content-Length": value})
        assert status == 400, (value, body)
    _still_serving(clients["http"], "http")


def test_http_byte_size_mismatch(server, clients):
    header = (b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","parameters":{"binary_data_size":12}},'
              b'{"name":"INPUT1","shape":[4],"datatype":"FP32","parameters":{"binary_data_size":16}}]}')
    status, body = _post(server, "/v2/models/add_sub/infer", header + bytes(28),
                         {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400 and b"byte size" in body, body
    _still_serving(clients["http"], "http")


def test_http_data_and_binary_size_together(server, clients):
    header = (b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,2,3,4],'
              b'"parameters":{"binary_data_size":16}},'
              b'{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,2,3,4]}]}')
    status, body = _post(server, "/v2/models/add_sub/infer", header + bytes(16),
                         {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400, body
    _still_serving(clients["http"], "http")


def _bytes_elements(*items: bytes) -> bytes:
    return b"".join(len(item).to_bytes(4, "little") + item for item in items)


# Bytes of a BYTES tensor of shape [2] that do not hold two elements, and Triton's words.
BYTES_LAYOUTS = {
    "three elements": (_bytes_elements(b"a", b"b", b"c"),
                       "[request id: <id_unknown>] unexpected number of string elements 3 for "
                       "inference input 'IN_BYTES' for model 'echo_all', expecting 2"),
    "one element": (_bytes_elements(b"a"),
                    "[request id: <id_unknown>] expected 2 string elements for inference input "
                    "'IN_BYTES' for model 'echo_all', got 1"),
    "a length cut short": (_bytes_elements(b"a", b"b") + b"\x01",
                           "[request id: <id_unknown>] incomplete string length indicator for "
                           "inference input 'IN_BYTES' for model 'echo_all', expecting 4 bytes "
                           "but only 1 bytes available. Please make sure the string length "
                           "indicator is in one buffer."),
    "the last element cut short": (_bytes_elements(b"a") + (5).to_bytes(4, "little") + b"bc",
                                   "incomplete string data for inference input 'IN_BYTES', "
                                   "expecting string of length 5 but only 2 bytes available"),
}


@pytest.mark.parametrize("layout", BYTES_LAYOUTS)
def test_bytes_that_miss_their_shape_get_tritons_message(server, clients, layout):
    raw, message = BYTES_LAYOUTS[layout]
    header = orjson.dumps({"inputs": [{"name": "IN_BYTES", "shape": [2], "datatype": "BYTES",
                                       "parameters": {"binary_data_size": len(raw)}}]})
    status, body = _post(server, "/v2/models/echo_all/infer", header + raw,
                         {"Inference-Header-Content-Length": str(len(header))})
    assert (status, orjson.loads(body)) == (400, {"error": message})

    request = service_pb2.ModelInferRequest(model_name="echo_all")
    request.inputs.add(name="IN_BYTES", datatype="BYTES", shape=[2])
    request.raw_input_contents.append(raw)
    with grpc.insecure_channel(server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as e:
            channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")(
                request.SerializeToString(), timeout=10)
    assert (e.value.code(), e.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)
    _still_serving(clients["grpc"], "grpc")


def test_a_bytes_element_cut_short_counts_as_a_failure_of_the_model(server, clients):
    # Triton's Python backend finds it reading the request: a failed request of the model,
    # where the other malformed BYTES are refused before the model counts them at all.
    def fail_count():
        stats = clients["http"].get_inference_statistics("echo_all")["model_stats"][0]
        return stats["inference_stats"]["fail"]["count"]

    before = fail_count()
    for layout in ("three elements", "the last element cut short"):
        raw, _ = BYTES_LAYOUTS[layout]
        header = orjson.dumps({"inputs": [{"name": "IN_BYTES", "shape": [2], "datatype": "BYTES",
                                           "parameters": {"binary_data_size": len(raw)}}]})
        status, _ = _post(server, "/v2/models/echo_all/infer", header + raw,
                          {"Inference-Header-Content-Length": str(len(header))})
        assert status == 400
    assert fail_count() == before + 1


@pytest.mark.parametrize("key, kind, value, message", [
    ("custom", "uint64_param", 1,
     "invalid value type for 'custom' parameter, expected int64_param, bool_param, or string_param."),
    ("timeout", "uint64_param", 5, "invalid value type for 'timeout' parameter, expected int64_param."),
    ("sequence_id", "uint64_param", 3,
     "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."),
    ("sequence_id", "bool_param", True,
     "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."),
    ("triton_enable_empty_final_response", "int64_param", 1,
     "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param."),
    ("triton_enable_empty_final_response", "string_param", "true",
     "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param."),
])
def test_grpc_request_parameters_of_a_kind_triton_refuses(server, clients, key, kind, value, message):
    request = service_pb2.ModelInferRequest(model_name="echo_all")
    request.inputs.add(name="IN_INT32", datatype="INT32", shape=[1])
    request.raw_input_contents.append(np.int32(7).tobytes())
    setattr(request.parameters[key], kind, value)
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as e:
            call(request.SerializeToString(), timeout=10)
        assert (e.value.code(), e.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)
        # Those Triton takes: priority as uint64, any other key as a double.
        request.parameters.clear()
        request.parameters["priority"].uint64_param = 1
        request.parameters["custom"].double_param = 1.5
        assert call(request.SerializeToString(), timeout=10)
    _still_serving(clients["grpc"], "grpc")


def test_http_index_ready_must_be_a_boolean(server, clients):
    status, body = _post(server, "/v2/repository/index", b'{"ready": "yes"}')
    assert status == 400 and b"'ready'" in body, body
    status, body = _post(server, "/v2/repository/index", b'{"ready": true}')
    assert status == 200 and all(m["state"] == "READY" for m in orjson.loads(body)), body


def test_http_raw_binary_errors_name_the_raw_input(server, clients):
    headers = {"Inference-Header-Content-Length": "0"}
    status, body = _post(server, "/v2/models/identity_fp32/infer", bytes(6), headers)
    assert (status, orjson.loads(body)) == (400, {"error": (
        "[request id: <id_unknown>] input byte size mismatch for input 'raw_input' for model "
        "'identity_fp32'. Expected 4, got 6")})
    status, body = _post(server, "/v2/models/add_sub/infer", bytes(16), headers)
    assert (status, orjson.loads(body)) == (400, {"error": (
        "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced "
        "but got 2 inputs in 'add_sub' model configuration")})
    _still_serving(clients["http"], "http")


def test_http_json_integers_and_fp32_as_triton_reads_and_writes_them(server, clients):
    def echo(datatype, data):
        return _post(server, "/v2/models/echo_all/infer", orjson.dumps({"inputs": [
            {"name": f"IN_{datatype}", "shape": [len(data)], "datatype": datatype, "data": data}]}))

    # 1.0 is not a JSON integer: refused for an integer datatype, as Triton refuses it.
    status, body = echo("INT32", [1, 1.0])
    assert status == 400 and b"expected INT32 values" in body, body
    # FP32 goes out as the double each value is exactly, as Triton writes it.
    status, body = echo("FP32", [0.1, 3.4e38])
    assert status == 200, body
    assert orjson.loads(body)["outputs"][0]["data"] == [0.10000000149011612, 3.3999999521443642e+38]
    _still_serving(clients["http"], "http")


def test_http_json_element_count_mismatch(server, clients):
    body = (b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,2,3]},'
            b'{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,2,3,4]}]}')
    status, out = _post(server, "/v2/models/add_sub/infer", body)
    assert status == 400, out
    _still_serving(clients["http"], "http")


def test_http_decompression_bomb_is_refused(server, clients):
    import gzip
    # 80 MiB of zeros squeeze into ~80 KiB; inflated it exceeds --http-max-input-size (64 MiB).
    bomb = gzip.compress(bytes(80 * 1024 * 1024))
    status, body = _post(server, "/v2/models/add_sub/infer", bomb, {"Content-Encoding": "gzip"})
    assert status == 400 and b"maximum input size" in body, body
    status, body = _post(server, "/v2/models/add_sub/infer", b"not gzip", {"Content-Encoding": "gzip"})
    assert status == 400 and b"decompress" in body, body
    _still_serving(clients["http"], "http")


def test_unknown_shared_memory_region_is_not_found(server, clients):
    # No region is registered, so naming one, for an input or an output, is NOT_FOUND,
    # never silently ignored.
    out_shm = (b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,2,3,4]},'
               b'{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,2,3,4]}],'
               b'"outputs":[{"name":"OUTPUT0","parameters":{"shared_memory_region":"r0",'
               b'"shared_memory_byte_size":16}}]}')
    status, body = _post(server, "/v2/models/add_sub/infer", out_shm)
    assert status == 404 and b"Unable to find shared memory region: 'r0'" in body, body
    in_shm = (b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","parameters":'
              b'{"shared_memory_region":"r1","shared_memory_byte_size":16}},'
              b'{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,2,3,4]}]}')
    status, body = _post(server, "/v2/models/add_sub/infer", in_shm)
    assert status == 404 and b"'r1'" in body, body
    _still_serving(clients["http"], "http")


def test_grpc_a_repeated_request_with_a_short_raw_tensor_is_still_refused(server, clients):
    """The server decodes and checks a repeated request head once (request templates); a
    later request with that head and fewer raw bytes gets the full check's answer, and the
    good request still runs after it."""
    request = service_pb2.ModelInferRequest(model_name="echo_all")
    request.inputs.add(name="IN_INT32", datatype="INT32", shape=[2])
    good = np.array([7, 8], np.int32).tobytes()
    request.raw_input_contents.append(good)
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for _ in range(3):
            assert call(request.SerializeToString(), timeout=10)
        request.raw_input_contents[0] = good[:4]
        with pytest.raises(grpc.RpcError) as e:
            call(request.SerializeToString(), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details() == ("[request id: <id_unknown>] input byte size mismatch for "
                                     "input 'IN_INT32' for model 'echo_all'. Expected 8, got 4")
        request.raw_input_contents[0] = good
        response = service_pb2.ModelInferResponse.FromString(
            call(request.SerializeToString(), timeout=10))
        assert response.model_name == "echo_all"
    _still_serving(clients["grpc"], "grpc")
