"""Decoupled models over gRPC ModelStreamInfer (tritonclient, sync and aio) against the bundled
`repeat` and `square` models: one response per element, in-band errors and refusals,
interleaving and order, and what Triton answers a decoupled model asked the unary way.

Waits are bounded and generous; only upper bounds of seconds are asserted on timing.
"""

import asyncio

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from tests.conftest import wait_for_models
from tests.e2e.streaming_helpers import (MODELS, WAIT_S, grpc_input, GrpcStream, http_url, is_final,
                                         repeat_inputs, square_inputs)


@pytest.fixture(scope="module", autouse=True)
def models_ready(server):
    wait_for_models(server, MODELS)


@pytest.mark.parametrize("empty_final", [False, True])
def test_repeat_streams_one_response_per_element(server, empty_final):
    with GrpcStream(server) as stream:
        stream.send("repeat", repeat_inputs([5, 6, 7]), request_id="r1",
                    enable_empty_final_response=empty_final)
        items = stream.finish()
    assert all(error is None for _, error in items), items
    results = [result for result, _ in items]
    data = results[:3]
    assert [int(r.as_numpy("OUT")[0]) for r in data] == [5, 6, 7]
    assert [int(r.as_numpy("IDX")[0]) for r in data] == [0, 1, 2]
    assert [r.as_numpy("IDX").dtype for r in data] == [np.uint32] * 3
    assert [is_final(r) for r in data] == [False] * 3
    assert [r.get_response().id for r in data] == ["r1"] * 3
    if not empty_final:
        assert len(results) == 3
        return
    assert len(results) == 4
    last = results[3].get_response()
    assert is_final(results[3])
    assert last.id == "r1" and last.model_name == "repeat"
    assert len(last.outputs) == 0 and len(last.raw_output_contents) == 0


@pytest.mark.parametrize("empty_final", [False, True])
def test_square_of_zero_sends_no_response(server, empty_final):
    with GrpcStream(server) as stream:
        stream.send("square", square_inputs(0), request_id="zero",
                    enable_empty_final_response=empty_final)
        items = stream.finish()
    if not empty_final:
        assert items == []
        return
    assert len(items) == 1
    result, error = items[0]
    assert error is None
    assert is_final(result)
    assert result.get_response().id == "zero" and len(result.get_response().outputs) == 0


def test_an_in_band_refusal_carries_the_request_id_alone(server):
    """As Triton 2.51 words them: a request refused before a model ran it (unknown model, bad
    input) gets an error whose response holds only its id; the stream goes on."""
    def request(model, name, request_id):
        msg = service_pb2.ModelInferRequest(model_name=model, id=request_id)
        msg.inputs.add(name=name, datatype="INT32", shape=[1])
        msg.raw_input_contents.append(np.int32(3).tobytes())
        return msg.SerializeToString()

    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        replies = [service_pb2.ModelStreamInferResponse.FromString(reply) for reply in call(
            iter([request("nope", "IN", "a"), request("square", "X", "b"),
                  request("square", "IN", "c")]), timeout=30)]
    refusals = [(r.error_message, r.infer_response) for r in replies if r.error_message]
    assert sorted((message, str(response)) for message, response in refusals) == [
        ("Request for unknown model: 'nope' is not found", 'id: "a"\n'),
        ("unexpected inference input 'X' for model 'square'", 'id: "b"\n')]
    assert [int(np.frombuffer(r.infer_response.raw_output_contents[0], np.int32)[0])
            for r in replies if not r.error_message] == [3, 3, 3]


def test_square_sends_n_responses_of_n(server):
    with GrpcStream(server) as stream:
        stream.send("square", square_inputs(4), enable_empty_final_response=True)
        results = stream.results(5)
        assert stream.finish() == []
    assert [int(r.as_numpy("OUT")[0]) for r in results[:4]] == [4] * 4
    assert [is_final(r) for r in results] == [False] * 4 + [True]


def test_requests_in_flight_on_one_stream_interleave(server):
    ids = ["a", "b", "c"]
    with GrpcStream(server) as stream:
        for n, request_id in enumerate(ids):
            values = [100 * n + i for i in range(5)]
            stream.send("repeat", repeat_inputs(values, delay_ms=40), request_id=request_id,
                        enable_empty_final_response=True)
        results = stream.results(len(ids) * 6)
        assert stream.finish() == []
    arrival = [r.get_response().id for r in results]
    # Each request takes 200 ms and all were sent at once: their responses are mixed.
    assert arrival.index("c") < len(arrival) - arrival[::-1].index("a") - 1, arrival
    for n, request_id in enumerate(ids):
        mine = [r for r in results if r.get_response().id == request_id]
        assert [int(r.as_numpy("OUT")[0]) for r in mine[:5]] == [100 * n + i for i in range(5)]
        assert [int(r.as_numpy("IDX")[0]) for r in mine[:5]] == list(range(5))
        assert [is_final(r) for r in mine] == [False] * 5 + [True]


def test_concurrent_streams_each_get_their_own_responses(server):
    async def one_stream(client, n):
        async def requests():
            for k in range(2):
                yield {"model_name": "repeat", "request_id": f"s{n}-{k}",
                       "inputs": repeat_inputs([n * 10 + k] * 3, delay_ms=20)}

        got = []
        async for result, error in client.stream_infer(requests()):
            assert error is None, error
            got.append(result)
        return got

    async def main():
        client = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            return await asyncio.wait_for(
                asyncio.gather(*(one_stream(client, n) for n in range(4))), WAIT_S)
        finally:
            await client.close()

    for n, got in enumerate(asyncio.run(main())):
        assert len(got) == 6
        for k in range(2):
            mine = [r for r in got if r.get_response().id == f"s{n}-{k}"]
            assert [int(r.as_numpy("OUT")[0]) for r in mine] == [n * 10 + k] * 3
            assert [int(r.as_numpy("IDX")[0]) for r in mine] == [0, 1, 2]


def test_models_that_are_not_decoupled_answer_in_request_order(server):
    with GrpcStream(server) as stream:
        # The first takes 0.5 s, the others are done long before it: they still wait.
        stream.send("slow", [grpc_input("INPUT0", np.array([0.5], np.float32))], request_id="a")
        stream.send("slow", [grpc_input("INPUT0", np.array([0.0], np.float32))], request_id="b")
        stream.send("identity_fp32", [grpc_input("INPUT0", np.ones((1, 3), np.float32))],
                    request_id="c")
        results = stream.results(3)
        assert stream.finish() == []
    assert [r.get_response().id for r in results] == ["a", "b", "c"]
    assert [is_final(r) for r in results] == [True] * 3
    np.testing.assert_array_equal(results[0].as_numpy("OUTPUT0"), [0.5])
    np.testing.assert_array_equal(results[2].as_numpy("OUTPUT0"), np.ones((1, 3)))


def test_responses_of_requests_served_one_after_the_other_keep_that_order(server):
    # stream_order answers each request in full (two responses, an error, the final flag)
    # before it starts the next: the stream must not let the next request's responses
    # overtake the end of the one before.
    n = grpc_input("N", np.array([2], np.int32))
    with GrpcStream(server) as stream:
        for request_id in ("a", "b", "c"):
            stream.send("stream_order", [n], request_id=request_id,
                        enable_empty_final_response=True)
        items = [stream.get() for _ in range(12)]
        assert stream.finish() == []
    seen = [("error" if result is None else result.get_response().id,
             result is not None and is_final(result)) for result, _ in items]
    assert seen == [step for rid in "abc"
                    for step in ((rid, False), (rid, False), ("error", False), (rid, True))]


# -- gRPC stream: errors -----------------------------------------------------------------------

def test_an_error_travels_in_band_and_the_stream_goes_on(server):
    with GrpcStream(server) as stream:
        stream.send("square", square_inputs(-1), request_id="bad")
        result, error = stream.get()
        assert result is None
        assert isinstance(error, InferenceServerException)
        assert error.message() == "IN must not be negative, got -1"
        stream.send("square", square_inputs(2), request_id="good")
        results = stream.results(2)
        assert stream.finish() == []
    assert [int(r.as_numpy("OUT")[0]) for r in results] == [2, 2]


def test_an_unknown_model_is_reported_in_band(server):
    with GrpcStream(server) as stream:
        stream.send("no_such_model", square_inputs(1), request_id="x")
        result, error = stream.get()
        assert result is None
        assert error.message() == "Request for unknown model: 'no_such_model' is not found"
        stream.send("square", square_inputs(1))
        (result,) = stream.results(1)
        assert int(result.as_numpy("OUT")[0]) == 1
        assert stream.finish() == []


@pytest.mark.parametrize("model, inputs, status, message", [
    ("square", square_inputs(-1), "StatusCode.INVALID_ARGUMENT",
     "IN must not be negative, got -1"),
    ("no_such_model", square_inputs(1), "StatusCode.NOT_FOUND",
     "Request for unknown model: 'no_such_model' is not found"),
])
def test_triton_grpc_error_ends_the_stream_with_the_status(server, model, inputs, status,
                                                             message):
    with GrpcStream(server, headers={"triton_grpc_error": "true"}) as stream:
        stream.send(model, inputs)
        result, error = stream.get()
        assert result is None
        assert error.status() == status
        assert error.message() == message
        with pytest.raises(InferenceServerException, match="no longer in valid state"):
            stream.send("square", square_inputs(1))


def test_model_infer_refuses_a_decoupled_model(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as e:
            client.infer("repeat", repeat_inputs([1]))
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"
    assert e.value.message() == ("ModelInfer RPC doesn't support models with decoupled "
                                 "transaction policy")


def test_http_infer_refuses_a_decoupled_model(server):
    body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}]}
    r = httpx.post(http_url(server, "repeat", "infer"), json=body)
    assert r.status_code == 501
    assert r.json() == {"error": "HTTP end point doesn't support models with decoupled "
                                 "transaction policy"}


# -- HTTP generate and generate_stream ---------------------------------------------------------
