"""Inference over HTTP (JSON and binary) and gRPC, sync and aio, for every datatype."""

import asyncio
import json

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio

from tests.conftest import wait_for_models

CLIENTS = {"http": httpclient, "grpc": grpcclient}

SAMPLES = {
    "BOOL": np.array([True, False, True]),
    "UINT8": np.array([0, 1, 255], np.uint8),
    "UINT16": np.array([0, 7, 65535], np.uint16),
    "UINT32": np.array([0, 9, 2**32 - 1], np.uint32),
    "UINT64": np.array([0, 11, 2**64 - 1], np.uint64),
    "INT8": np.array([-128, 0, 127], np.int8),
    "INT16": np.array([-32768, 5, 32767], np.int16),
    "INT32": np.array([-(2**31), 6, 2**31 - 1], np.int32),
    "INT64": np.array([-(2**63), 8, 2**63 - 1], np.int64),
    "FP16": np.array([0.5, -1.25, 65504], np.float16),
    "FP32": np.array([1.5, -2.25, 3.0e38], np.float32),
    "FP64": np.array([1e-300, -2.5, 1e300], np.float64),
    "BYTES": np.array([b"alpha", b"", "\u00e9t\u00e9".encode()], np.object_),
    "BF16": np.array([1.0, -2.0, 0.5], ml_dtypes.bfloat16),
}
JSON_TYPES = [t for t in SAMPLES if t not in ("FP16", "BF16")]


def _input(mod, name, arr, dtype, binary=True):
    inp = mod.InferInput(name, list(arr.shape), dtype)
    if mod is httpclient or mod is httpaio:
        inp.set_data_from_numpy(arr, binary_data=binary)
    else:
        inp.set_data_from_numpy(arr)
    return inp


def _output(mod, name, binary=True):
    if mod is httpclient or mod is httpaio:
        return mod.InferRequestedOutput(name, binary_data=binary)
    return mod.InferRequestedOutput(name)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_add_sub(clients, protocol):
    mod = CLIENTS[protocol]
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 2.0, np.float32)
    result = clients[protocol].infer("add_sub", [_input(mod, "INPUT0", a, "FP32"),
                                                 _input(mod, "INPUT1", b, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["add_sub_onnx", "add_sub_torchscript"])
def test_the_framework_examples_answer_as_add_sub(server, clients, protocol, model):
    wait_for_models(server, [model])
    mod = CLIENTS[protocol]
    a = np.arange(8, dtype=np.float32).reshape(2, 4)  # these two batch: [batch, 4]
    b = np.full((2, 4), 2.0, np.float32)
    result = clients[protocol].infer(model, [_input(mod, "INPUT0", a, "FP32"),
                                             _input(mod, "INPUT1", b, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_add_sub_http_json(clients):
    a = np.arange(4, dtype=np.float32)
    inputs = [_input(httpclient, "INPUT0", a, "FP32", binary=False),
              _input(httpclient, "INPUT1", a, "FP32", binary=False)]
    outputs = [_output(httpclient, "OUTPUT0", binary=False), _output(httpclient, "OUTPUT1", binary=False)]
    result = clients["http"].infer("add_sub", inputs, outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)
    assert result.get_output("OUTPUT0")["data"] == [0.0, 2.0, 4.0, 6.0]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("dtype", list(SAMPLES))
def test_every_datatype_round_trips(clients, protocol, dtype):
    mod = CLIENTS[protocol]
    arr = SAMPLES[dtype]
    result = clients[protocol].infer("echo_all", [_input(mod, f"IN_{dtype}", arr, dtype)],
                                     outputs=[_output(mod, f"OUT_{dtype}")])
    got = result.as_numpy(f"OUT_{dtype}")
    assert result.get_output(f"OUT_{dtype}") is not None
    if dtype == "BF16":
        assert got.view(np.uint16).tobytes() == arr.view(np.uint16).tobytes()
    else:
        np.testing.assert_array_equal(got, arr)
        assert got.dtype == arr.dtype


@pytest.mark.parametrize("dtype", JSON_TYPES)
def test_every_json_datatype_round_trips(clients, dtype):
    arr = SAMPLES[dtype]
    if dtype == "BYTES":
        arr = np.array([b"alpha", b"", b"gamma"], np.object_)
    result = clients["http"].infer(
        "echo_all", [_input(httpclient, f"IN_{dtype}", arr, dtype, binary=False)],
        outputs=[_output(httpclient, f"OUT_{dtype}", binary=False)])
    got = result.as_numpy(f"OUT_{dtype}")
    if dtype == "BYTES":  # JSON carries strings; tritonclient hands them back as str
        arr = np.array([b.decode() for b in arr], np.object_)
    np.testing.assert_array_equal(got, arr)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_all_datatypes_in_one_request(clients, protocol):
    mod = CLIENTS[protocol]
    inputs = [_input(mod, f"IN_{t}", a, t) for t, a in SAMPLES.items()]
    result = clients[protocol].infer("echo_all", inputs)
    for t, a in SAMPLES.items():
        got = result.as_numpy(f"OUT_{t}")
        assert got.view(np.uint8).tobytes() == a.view(np.uint8).tobytes() if t not in ("BYTES",) \
            else list(got) == list(a)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_requested_output_subset(clients, protocol):
    mod = CLIENTS[protocol]
    a = np.ones(4, np.float32)
    result = clients[protocol].infer("add_sub", [_input(mod, "INPUT0", a, "FP32"),
                                                 _input(mod, "INPUT1", a, "FP32")],
                                     outputs=[_output(mod, "OUTPUT1")])
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros(4, np.float32))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_request_id_and_parameters_reach_the_model(clients, protocol):
    mod = CLIENTS[protocol]
    x = np.array([1, 2], np.int32)
    result = clients[protocol].infer("params_echo", [_input(mod, "INPUT0", x, "INT32")],
                                     request_id="req-42",
                                     parameters={"s": "x", "n": 7, "b": True})
    assert result.get_response(as_json=True)["id"] == "req-42" if protocol == "grpc" \
        else result.get_response()["id"] == "req-42"
    assert result.as_numpy("REQUEST_ID")[0] == b"req-42"
    params = result.as_numpy("PARAMS")[0]
    assert json.loads(params) == {"s": "x", "n": 7, "b": True}
    assert b" " not in params  # compact, as Triton hands it over
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_strings(clients, protocol):
    mod = CLIENTS[protocol]
    words = np.array(["hello".encode(), "w\u00f6rld".encode(), b"\x00\xff"], np.object_)
    result = clients[protocol].infer("string_echo", [_input(mod, "INPUT0", words, "BYTES")])
    assert list(result.as_numpy("OUTPUT0")) == list(words)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_batched_model(clients, protocol):
    mod = CLIENTS[protocol]
    x = np.arange(24, dtype=np.float32).reshape(3, 8)
    result = clients[protocol].infer("identity_batch", [_input(mod, "INPUT0", x, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_large_tensor_goes_through_shared_memory(clients, protocol):
    # 4 MiB: above the inline threshold, so input and output travel through the arenas.
    mod = CLIENTS[protocol]
    x = np.random.default_rng(0).random((1, 1 << 20), dtype=np.float32)
    for _ in range(3):  # slots are released and reused
        result = clients[protocol].infer("identity_fp32", [_input(mod, "INPUT0", x, "FP32")])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)


def test_aio_clients(server):
    async def run():
        x = np.arange(4, dtype=np.float32)
        h = httpaio.InferenceServerClient(server.http_url)
        g = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            assert await h.is_server_live() and await g.is_server_live()
            rh, rg = await asyncio.gather(
                h.infer("add_sub", [_input(httpaio, "INPUT0", x, "FP32"), _input(httpaio, "INPUT1", x, "FP32")]),
                g.infer("add_sub", [_input(grpcaio, "INPUT0", x, "FP32"), _input(grpcaio, "INPUT1", x, "FP32")]))
            np.testing.assert_array_equal(rh.as_numpy("OUTPUT0"), x * 2)
            np.testing.assert_array_equal(rg.as_numpy("OUTPUT0"), x * 2)
        finally:
            await h.close()
            await g.close()
    asyncio.run(run())


def test_instances_run_in_parallel(server):
    # `slow` has two instances and sleeps INPUT0[0] seconds: two concurrent requests must
    # overlap in time, so the second finishes long before the two sleeps added up.
    async def run():
        g = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            x = np.array([1.0], np.float32)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await asyncio.gather(*(g.infer("slow", [_input(grpcaio, "INPUT0", x, "FP32")]) for _ in range(2)))
            return loop.time() - t0
        finally:
            await g.close()
    assert asyncio.run(run()) < 1.9


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_http_compression_both_ways(clients, algorithm):
    x = np.arange(1000, dtype=np.float32)
    inputs = [_input(httpclient, "INPUT0", x[:4], "FP32"), _input(httpclient, "INPUT1", x[:4], "FP32")]
    result = clients["http"].infer("add_sub", inputs, request_compression_algorithm=algorithm,
                                   response_compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x[:4] * 2)


def test_http_raw_binary_request(server):
    # Inference-Header-Content-Length: 0: the body is the only input's bytes, as batch 1,
    # and every output comes back binary.
    import urllib.request
    x = np.arange(6, dtype=np.float32)
    req = urllib.request.Request(f"http://{server.http_url}/v2/models/identity_fp32/infer",
                                 data=x.tobytes(), method="POST",
                                 headers={"Inference-Header-Content-Length": "0",
                                          "Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(req) as resp:
        header_length = int(resp.headers["Inference-Header-Content-Length"])
        body = resp.read()
    header = json.loads(body[:header_length])
    assert header["outputs"][0]["shape"] == [1, 6]
    assert header["outputs"][0]["parameters"]["binary_data_size"] == 24
    np.testing.assert_array_equal(np.frombuffer(body[header_length:], np.float32), x)
