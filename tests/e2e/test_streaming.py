"""Decoupled models end to end: gRPC ModelStreamInfer (tritonclient, sync and aio), HTTP
generate / generate_stream (httpx, httpx_sse) and the in-process `Server.stream`, against the
bundled `repeat` and `square` models and the test model `stream_probe`, whose record file shows
from outside what the model did (tests/models/README.md): whether a cancellation reached it,
and how far it got while the client was not reading.

Waits are bounded and generous; only upper bounds of seconds are asserted on timing.
"""

import asyncio
import contextlib
import queue
import threading
import time
import urllib.request

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from httpx_sse import connect_sse
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from shmserve.host.server import Options, Server
from shmserve.inference import InferRequest, InputTensor
from tests.conftest import wait_for_models
from workers.loop import FIRST_WINDOW, RESPONSE_WINDOW

MODELS = ("repeat", "square", "stream_probe", "slow", "identity_fp32", "stream_order")
WAIT_S = 10.0  # the most any single response or state change may take


@pytest.fixture(scope="module", autouse=True)
def models_ready(server):
    wait_for_models(server, MODELS)


# -- helpers -----------------------------------------------------------------------------------

def grpc_input(name: str, array: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), _DATATYPES[array.dtype.type])
    tensor.set_data_from_numpy(array)
    return tensor


_DATATYPES = {np.int32: "INT32", np.uint32: "UINT32", np.float32: "FP32"}


def repeat_inputs(values, delay_ms=None) -> list:
    inputs = [grpc_input("IN", np.array(values, dtype=np.int32))]
    if delay_ms is not None:
        inputs.append(grpc_input("DELAY", np.full(len(values), delay_ms, dtype=np.uint32)))
    return inputs


def square_inputs(n: int) -> list:
    return [grpc_input("IN", np.array([n], dtype=np.int32))]


def probe_inputs(count: int, size: int = None) -> list:
    inputs = [grpc_input("COUNT", np.array([count], dtype=np.int32))]
    if size is not None:
        inputs.append(grpc_input("SIZE", np.array([size], dtype=np.int32)))
    return inputs


def is_final(result) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


class GrpcStream:
    """One tritonclient ModelStreamInfer call; its callback queues each (result, error), then
    waits for `gate` (if given) to open: until then the client reads nothing more."""

    def __init__(self, server, headers=None, gate: threading.Event = None):
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.items: queue.Queue = queue.Queue()
        self._gate = gate
        self.client.start_stream(callback=self._callback, headers=headers)

    def _callback(self, result, error):
        self.items.put((result, error))
        if self._gate is not None:
            self._gate.wait()

    def send(self, model: str, inputs: list, request_id: str = "", **options) -> None:
        self.client.async_stream_infer(model, inputs, request_id=request_id, **options)

    def get(self):
        try:
            return self.items.get(timeout=WAIT_S)
        except queue.Empty:
            raise AssertionError(f"no response on the stream within {WAIT_S} s") from None

    def results(self, n: int) -> list:
        """The next n items, which must all be results."""
        out = []
        for _ in range(n):
            result, error = self.get()
            assert error is None, error
            out.append(result)
        return out

    def finish(self) -> list:
        """Close our side and wait until the server has answered every request and ended the
        call: what arrived until then."""
        closer = threading.Thread(target=self.client.stop_stream)
        closer.start()
        closer.join(WAIT_S)
        if closer.is_alive():
            self.client.stop_stream(cancel_requests=True)
            closer.join()
            raise AssertionError(f"the server did not end the stream within {WAIT_S} s")
        return self.drain()

    def drain(self) -> list:
        out = []
        while not self.items.empty():
            out.append(self.items.get_nowait())
        return out

    def close(self) -> None:
        if self._gate is not None:
            self._gate.set()
        self.client.stop_stream(cancel_requests=True)
        self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_record(path: str):
    """(what, k) from a stream_probe record file; None before the model wrote it."""
    try:
        with open(path) as f:
            what, k = f.read().split()
    except FileNotFoundError:
        return None
    return what, int(k)


def wait_record(path: str, what: str, within: float):
    deadline = time.monotonic() + within
    while True:
        record = read_record(path)
        if record is not None and record[0] == what:
            return record
        if time.monotonic() > deadline:
            raise AssertionError(f"the model's record is {record}, not '{what}', after {within} s")
        time.sleep(0.01)


def metric(server, name: str, model: str, **labels) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                timeout=5) as r:
        text = r.read().decode()
    wanted = [f'model="{model}"'] + [f'{k}="{v}"' for k, v in labels.items()]
    for line in text.splitlines():
        if line.startswith(name + "{") and all(w in line for w in wanted):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} for {model} {labels}")


def settled(read):
    """What `read()` gives once it has stopped moving. A stream's request is counted once its
    batch has ended, which may be just after its last response reached the client: a count
    read right after a test's (or an earlier test's) answer can still change."""
    value, deadline = read(), time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        time.sleep(0.05)
        again = read()
        if again == value:
            return value
        value = again
    raise AssertionError(f"still moving after {WAIT_S} s: {value}")


def success_counts(server, model: str) -> tuple:
    """(inference_count, success count) from the statistics extension."""
    stats = httpx.get(f"http://{server.http_url}/v2/models/{model}/stats").json()
    entry = stats["model_stats"][0]
    return entry["inference_count"], entry["inference_stats"]["success"]["count"]


def http_url(server, model: str, endpoint: str) -> str:
    return f"http://{server.http_url}/v2/models/{model}/{endpoint}"


# -- gRPC stream: responses of decoupled models ------------------------------------------------

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

def test_generate_returns_the_single_response(server):
    r = httpx.post(http_url(server, "square", "generate"), json={"IN": 1, "id": "g1"})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == {"id": "g1", "model_name": "square", "model_version": "1", "OUT": 1}


@pytest.mark.parametrize("model, body", [("square", {"IN": 2}), ("repeat", {"IN": []})],
                         ids=["two responses", "none"])
def test_generate_answers_an_error_when_the_model_sends_other_than_one_response(server, model,
                                                                                body):
    success = settled(lambda: metric(server, "nv_inference_request_success", model))
    r = httpx.post(http_url(server, model, "generate"), json=body)
    # As Triton 2.51: 200, with the error as the body.
    assert r.status_code == 200
    assert r.json() == {"error": "generate expects model to produce exactly 1 response, use "
                                 "generate stream for model that generates various number of "
                                 "responses"}
    # The model's stream ran to its end, and Triton counts it a success.
    deadline = time.monotonic() + WAIT_S
    while metric(server, "nv_inference_request_success", model) == success \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    assert metric(server, "nv_inference_request_success", model) == success + 1


def test_generate_stream_sends_one_event_per_response(server):
    with httpx.Client(timeout=WAIT_S) as client:
        with connect_sse(client, "POST", http_url(server, "repeat", "generate_stream"),
                         json={"IN": [3, 4, 5]}) as events:
            assert events.response.status_code == 200
            assert events.response.headers["content-type"].startswith("text/event-stream")
            docs = [event.json() for event in events.iter_sse()]
    assert docs == [{"model_name": "repeat", "model_version": "1", "OUT": 3 + i, "IDX": i}
                    for i in range(3)]


def test_generate_stream_reports_a_later_error_as_an_event(server):
    success = settled(lambda: metric(server, "nv_inference_request_success", "stream_probe"))
    failure = settled(lambda: metric(server, "nv_inference_request_failure", "stream_probe",
                                     reason="BACKEND"))
    with httpx.Client(timeout=WAIT_S) as client:
        with connect_sse(client, "POST", http_url(server, "stream_probe", "generate_stream"),
                         json={"COUNT": 5, "fail_after": 2}) as events:
            assert events.response.status_code == 200
            docs = [event.json() for event in events.iter_sse()]
    assert [d.get("OUT") for d in docs[:2]] == [[0] * 4, [1] * 4]
    assert docs[2:] == [{"error": "probe failure"}]
    # The model answered with that error, as Triton sees it: the request is a success.
    deadline = time.monotonic() + WAIT_S
    while metric(server, "nv_inference_request_success", "stream_probe") == success \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    assert metric(server, "nv_inference_request_success", "stream_probe") == success + 1
    assert metric(server, "nv_inference_request_failure", "stream_probe", reason="BACKEND") == failure


@pytest.mark.parametrize("model, body, status", [
    ("repeat", {}, 400),
    ("repeat", {"IN": [1], "DELAY": "soon"}, 400),
    ("no_such_model", {"IN": 1}, 404),
])
def test_generate_stream_refuses_a_bad_request_before_streaming(server, model, body, status):
    r = httpx.post(http_url(server, model, "generate_stream"), json=body)
    assert r.status_code == status
    assert r.headers["content-type"].startswith("application/json")
    assert set(r.json()) == {"error"}


def test_generate_stream_of_an_error_first_is_an_error_status(server):
    # As Triton answers (perf/compat_probe.py): 400 whatever the model's code, and the error
    # still as an event.
    r = httpx.post(http_url(server, "square", "generate_stream"), json={"IN": -1})
    assert r.status_code == 400
    assert r.text == 'data: {"error":"IN must not be negative, got -1"}\n\n'


def test_generate_answers_a_models_error_400_and_sorts_its_keys(server):
    r = httpx.post(http_url(server, "square", "generate"), json={"IN": -1})
    assert (r.status_code, r.json()) == (400, {"error": "IN must not be negative, got -1"})
    r = httpx.post(http_url(server, "repeat", "generate_stream"), json={"IN": [7]})
    assert r.text.startswith('data: {"IDX":0,"OUT":7,"model_name":"repeat","model_version":"1"')


# -- cancellation reaches the model ------------------------------------------------------------

def cancelled_before(server) -> float:
    return metric(server, "nv_inference_request_failure", "stream_probe", reason="CANCELED")


def assert_cancelled_and_still_serving(server, record: str, failures_before: float) -> None:
    _, k = wait_record(record, "cancelled", within=2.0)
    assert 1 <= k < 1000
    time.sleep(0.1)
    assert read_record(record) == ("cancelled", k)  # nothing sent after
    deadline = time.monotonic() + 2.0
    while cancelled_before(server) < failures_before + 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert cancelled_before(server) == failures_before + 1
    assert metric(server, "nv_inference_pending_request_count", "stream_probe") == 0
    r = httpx.post(http_url(server, "stream_probe", "generate"), json={"COUNT": 1})
    assert r.status_code == 200 and r.json()["OUT"] == [0] * 4


def test_closing_a_grpc_stream_cancels_its_requests(server, tmp_path):
    record = str(tmp_path / "record")
    before = cancelled_before(server)
    with GrpcStream(server) as stream:
        stream.send("stream_probe", probe_inputs(1000), parameters={"record_to": record,
                                                                    "delay_ms": 20})
        stream.results(1)
        stream.client.stop_stream(cancel_requests=True)
    assert_cancelled_and_still_serving(server, record, before)


def test_cancelling_an_aio_stream_cancels_its_requests(server, tmp_path):
    record = str(tmp_path / "record")
    before = cancelled_before(server)

    async def main():
        async def requests():
            yield {"model_name": "stream_probe", "inputs": probe_inputs(1000),
                   "parameters": {"record_to": record, "delay_ms": 20}}
            await asyncio.sleep(3600)  # keep our side of the call open

        async with grpcaio.InferenceServerClient(server.grpc_url) as client:
            responses = client.stream_infer(requests())
            result, error = await asyncio.wait_for(responses.__anext__(), WAIT_S)
            assert error is None and list(result.as_numpy("OUT")) == [0] * 4
            responses.cancel()

    asyncio.run(main())
    assert_cancelled_and_still_serving(server, record, before)


def test_closing_an_sse_stream_cancels_its_request(server, tmp_path):
    record = str(tmp_path / "record")
    before = cancelled_before(server)
    with httpx.Client(timeout=WAIT_S) as client:
        with connect_sse(client, "POST", http_url(server, "stream_probe", "generate_stream"),
                         json={"COUNT": 1000, "delay_ms": 20, "record_to": record}) as events:
            first = next(events.iter_sse()).json()
    assert first["OUT"] == [0] * 4
    assert_cancelled_and_still_serving(server, record, before)


# -- backpressure: a reader that stops reading stops the model ---------------------------------

def test_in_process_stream_is_bounded_by_the_response_window(test_repository, tmp_path):
    record = str(tmp_path / "record")
    count = 1000

    async def main():
        server = Server(Options(model_repository=[test_repository],
                                model_control_mode="explicit", load_model=["stream_probe"],
                                allow_http=False, allow_grpc=False, allow_metrics=False))
        await server.start()
        try:
            request = InferRequest("stream_probe", inputs=[
                InputTensor("COUNT", "INT32", [1], np.array([count], np.int32).tobytes())],
                parameters={"record_to": record})
            async with contextlib.aclosing(server.stream(request)) as responses:
                values = []
                paused = []
                async for item in responses:
                    if item.response is None:
                        continue
                    values.append(bytes(item.response.outputs[0].data))
                    item.response.done()
                    if len(values) <= 2:
                        # Not asking for the next one: the model may run ahead by the window
                        # (one response until the first is consumed).
                        await asyncio.sleep(1.0)
                        paused.append(read_record(record)[1])
            return values, paused
        finally:
            await server.stop()

    values, (before_first_consumed, after) = asyncio.run(main())
    assert before_first_consumed == FIRST_WINDOW
    assert RESPONSE_WINDOW // 2 < after <= RESPONSE_WINDOW + 2
    assert values == [bytes([k % 256]) * 4 for k in range(count)]
    assert read_record(record) == ("sent", count)


def test_grpc_client_that_does_not_read_stops_the_model(server, tmp_path):
    record = str(tmp_path / "record")
    size = 256 * 1024
    count = 400
    reading = threading.Event()
    with GrpcStream(server, gate=reading) as stream:
        stream.send("stream_probe", probe_inputs(count, size), parameters={"record_to": record})
        (first,) = stream.results(1)  # the callback now blocks: the client reads no more
        time.sleep(1.0)
        _, stalled = read_record(record)
        time.sleep(0.5)
        assert read_record(record) == ("sent", stalled)
        # The window, plus what gRPC's flow control lets the client take unread: its windows
        # grow with the bandwidth it measures (16 MiB here, 21 MiB on a 16-core GPU machine).
        assert stalled <= RESPONSE_WINDOW + 128, stalled
        reading.set()
        outs = [first.as_numpy("OUT")] + [r.as_numpy("OUT") for r in stream.results(count - 1)]
        assert stream.finish() == []
    for k, out in enumerate(outs):
        assert out.shape == (size,) and out[0] == k % 256 and out[-1] == k % 256


# -- statistics --------------------------------------------------------------------------------

def test_stream_requests_count_in_the_statistics(server):
    before = settled(lambda: success_counts(server, "repeat"))
    with GrpcStream(server) as stream:
        for n in range(3):
            stream.send("repeat", repeat_inputs([n, n]))
        items = stream.finish()
    assert len(items) == 6
    r = httpx.post(http_url(server, "repeat", "generate_stream"), json={"IN": [1]})
    assert r.status_code == 200
    after = settled(lambda: success_counts(server, "repeat"))
    assert (after[0] - before[0], after[1] - before[1]) == (4, 4)
