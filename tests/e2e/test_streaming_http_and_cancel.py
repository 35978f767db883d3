"""Decoupled models over HTTP generate / generate_stream (httpx, httpx_sse), and cancellation
and backpressure on every way in (gRPC streams, server-sent events, the in-process
`Server.stream`), seen from outside through the test model `stream_probe`'s record file
(tests/models/README.md): whether a cancellation reached it, and how far it got while the
client was not reading; and the statistics streams leave.

Waits are bounded and generous; only upper bounds of seconds are asserted on timing.
"""

import asyncio
import contextlib
import threading
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
from httpx_sse import connect_sse

from shmserve.host.server import Options, Server
from shmserve.inference import InferRequest, InputTensor
from tests.conftest import wait_for_models
from tests.e2e.streaming_helpers import (MODELS, WAIT_S, GrpcStream, http_url, metric, probe_inputs,
                                         read_record, repeat_inputs, settled, success_counts,
                                         wait_record)
from workers.loop import FIRST_WINDOW, RESPONSE_WINDOW


@pytest.fixture(scope="module", autouse=True)
def models_ready(server):
    wait_for_models(server, MODELS)


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
