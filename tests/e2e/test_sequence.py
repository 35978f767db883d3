"""Stateful models end to end: the sequence batcher (direct and oldest), its control inputs,
idle timeout and backlog, implicit state, and iterative sequences, through tritonclient over
HTTP and gRPC, against the test models `seq_probe`, `seq_idle`, `seq_string`, `seq_state`,
`iterative_steps` and `iterative_stream` (tests/models/README.md).

Sequence ids are unique per test, so tests do not share sequences. Only upper bounds of
seconds are asserted on timing, except where a request must still be waiting.
"""

import asyncio
import itertools
import queue
from contextlib import closing

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from tests.conftest import wait_for_models

MODELS = ("seq_probe", "seq_idle", "seq_string", "seq_state", "iterative_steps",
          "iterative_stream")
IDLE_S = 0.5  # seq_idle's max_sequence_idle_microseconds
WAIT_S = 10.0

_ids = itertools.count(1000)


@pytest.fixture(params=["http", "grpc"])
def protocol(request):
    return request.param


@pytest.fixture(scope="module", autouse=True)
def models_ready(server):
    wait_for_models(server, MODELS)


class Client:
    """One protocol's aio client, with int32 [1, 1] inputs."""

    def __init__(self, server, protocol: str):
        self.protocol = protocol
        self.lib = httpclient if protocol == "http" else grpcclient
        self.client = (httpaio.InferenceServerClient(server.http_url) if protocol == "http"
                       else grpcaio.InferenceServerClient(server.grpc_url))

    def tensor(self, name, array):
        t = self.lib.InferInput(name, list(array.shape),
                                {np.int32: "INT32", np.float32: "FP32"}[array.dtype.type])
        t.set_data_from_numpy(array)
        return t

    async def infer(self, model, value, sequence_id=0, start=False, end=False, delay=None,
                    name="INPUT"):
        inputs = [self.tensor(name, np.array([[value]], dtype=np.int32))]
        if delay is not None:
            inputs.append(self.tensor("DELAY", np.array([[delay]], dtype=np.float32)))
        return await self.client.infer(model, inputs, sequence_id=sequence_id,
                                       sequence_start=start, sequence_end=end)

    async def close(self):
        await self.client.close()


def run(server, protocol, body):
    async def main():
        client = Client(server, protocol)
        try:
            return await asyncio.wait_for(body(client), 60)
        finally:
            await client.close()
    return asyncio.run(main())


def first(result, name):
    return result.as_numpy(name).reshape(-1)[0]


def test_interleaved_sequences_keep_separate_sums(server, protocol):
    async def body(c):
        a, b = next(_ids), next(_ids)
        sums = []
        sums.append(first(await c.infer("seq_probe", 1, a, start=True), "OUTPUT"))
        sums.append(first(await c.infer("seq_probe", 10, b, start=True), "OUTPUT"))
        sums.append(first(await c.infer("seq_probe", 2, a), "OUTPUT"))
        sums.append(first(await c.infer("seq_probe", 20, b, end=True), "OUTPUT"))
        sums.append(first(await c.infer("seq_probe", 3, a, end=True), "OUTPUT"))
        assert sums == [1, 10, 3, 30, 6]
    run(server, protocol, body)


def test_concurrent_sequences_are_batched_and_stay_apart(server, protocol):
    async def body(c):
        ids = [next(_ids) for _ in range(4)]

        async def sequence(i, corrid):
            total = []
            for step in range(5):
                result = await c.infer("seq_probe", i + 1, corrid, start=step == 0,
                                       end=step == 4)
                total.append(first(result, "OUTPUT"))
            return total

        sums = await asyncio.gather(*(sequence(i, corrid) for i, corrid in enumerate(ids)))
        assert sums == [[(i + 1) * (k + 1) for k in range(5)] for i in range(4)]
    run(server, protocol, body)


def test_control_values_and_null_requests_per_slot(server):
    async def body(c):
        low, high = next(_ids), next(_ids)
        r = await c.infer("seq_probe", 1, low, start=True)
        low_row = first(r, "ROW")
        assert list(r.as_numpy("CONTROLS").reshape(-1)) == [1, 0, 1, low]
        assert first(r, "FLAGS") == 1
        r = await c.infer("seq_probe", 1, high, start=True)
        high_row = first(r, "ROW")
        assert high_row > low_row  # the lowest free slot goes first
        # `low` has nothing queued: a null request (READY false) holds its row.
        r = await c.infer("seq_probe", 5, high)
        assert first(r, "ROW") == high_row
        assert list(r.as_numpy("CONTROLS").reshape(-1)) == [0, 0, 1, high]
        assert first(r, "FLAGS") == 0
        ready = r.as_numpy("BATCH_READY").reshape(-1)
        assert ready[high_row] == 1 and ready[low_row] == 0
        r = await c.infer("seq_probe", 2, low, end=True)
        assert list(r.as_numpy("CONTROLS").reshape(-1)) == [0, 1, 1, low]
        assert first(r, "FLAGS") == 2 and first(r, "OUTPUT") == 3
        r = await c.infer("seq_probe", 1, high, end=True)
        assert first(r, "OUTPUT") == 7
    run(server, "grpc", body)


def test_a_request_without_correlation_id_is_refused(server, protocol):
    async def body(c):
        with pytest.raises(InferenceServerException) as refused:
            await c.infer("seq_probe", 1, start=True)
        assert "must specify a non-zero or non-empty correlation ID" in refused.value.message()
        assert refused.value.status() == ("400" if protocol == "http"
                                          else "StatusCode.INVALID_ARGUMENT")
    run(server, protocol, body)


def test_a_sequence_must_start_with_start(server, protocol):
    async def body(c):
        corrid = next(_ids)
        with pytest.raises(InferenceServerException) as refused:
            await c.infer("seq_probe", 1, corrid)
        assert (f"inference request for sequence {corrid} to model 'seq_probe' must specify the "
                f"START flag on the first request of the sequence") in refused.value.message()
    run(server, protocol, body)


def test_refused_sequence_requests_are_counted_nowhere(server):
    # As in Triton: like a request that fails validation, neither a failure nor a success.
    with httpclient.InferenceServerClient(server.http_url) as http:
        def counts():
            stats = http.get_inference_statistics("seq_probe")["model_stats"][0]
            return (stats["inference_stats"]["fail"]["count"],
                    stats["inference_stats"]["success"]["count"])

        before = counts()

        async def body(c):
            for kwargs in ({"start": True}, {"sequence_id": next(_ids)}):
                with pytest.raises(InferenceServerException):
                    await c.infer("seq_probe", 1, **kwargs)
        run(server, "http", body)
        assert counts() == before


def test_an_idle_sequence_is_ended(server):
    async def body(c):
        corrid = next(_ids)
        await c.infer("seq_idle", 1, corrid, start=True)
        await asyncio.sleep(IDLE_S * 2.5)
        with pytest.raises(InferenceServerException) as refused:
            await c.infer("seq_idle", 1, corrid)
        assert "must specify the START flag" in refused.value.message()
        # The id may start afresh.
        r = await c.infer("seq_idle", 4, corrid, start=True, end=True)
        assert first(r, "OUTPUT") == 4
    run(server, "http", body)


def test_new_sequences_wait_in_the_backlog_while_every_slot_is_taken(server):
    async def body(c):
        held = [next(_ids) for _ in range(4)]  # seq_probe: 1 instance, 4 slots
        await asyncio.gather(*(c.infer("seq_probe", 1, s, start=True) for s in held))
        waiting = asyncio.ensure_future(c.infer("seq_probe", 7, next(_ids), start=True,
                                                end=True))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        await c.infer("seq_probe", 1, held[0], end=True)
        assert first(await asyncio.wait_for(waiting, WAIT_S), "OUTPUT") == 7
        for s in held[1:]:
            await c.infer("seq_probe", 1, s, end=True)
    run(server, "grpc", body)


def test_string_correlation_id_with_a_uint64_control(server, protocol):
    """seq_probe's CORRID control is TYPE_UINT64: a string id reaches the model as Triton
    hands it over, the first 8 bytes of its BYTES element (length, then characters)."""
    async def body(c):
        r = await c.infer("seq_probe", 5, "a", start=True)
        assert first(r, "OUTPUT") == 5
        assert r.as_numpy("CONTROLS").reshape(-1)[3] == (ord("a") << 32) | 1
        r = await c.infer("seq_probe", 2, "a", end=True)
        assert first(r, "OUTPUT") == 7
    run(server, protocol, body)


def test_string_correlation_ids_with_the_oldest_strategy(server, protocol):
    async def body(c):
        a, b = f"alpha-{next(_ids)}", f"beta-{next(_ids)}"
        out = []
        for corrid, value, start, end in ((a, 1, True, False), (b, 100, True, False),
                                          (a, 2, False, False), (b, 200, False, True),
                                          (a, 3, False, True)):
            r = await c.infer("seq_string", value, corrid, start=start, end=end)
            out.append((first(r, "OUTPUT"), first(r, "CORRID").decode()))
        assert out == [(1, a), (100, b), (3, a), (300, b), (6, a)]
        # An integer id that reads the same is another sequence.
        with pytest.raises(InferenceServerException):
            await c.infer("seq_string", 1, 4242)
    run(server, protocol, body)


def test_implicit_state_carries_across_requests(server, protocol):
    async def body(c):
        a, b = next(_ids), next(_ids)
        out = [first(await c.infer("seq_state", 5, a, start=True), "OUTPUT"),
               first(await c.infer("seq_state", 1, b, start=True), "OUTPUT"),
               first(await c.infer("seq_state", 5, a), "OUTPUT"),
               first(await c.infer("seq_state", 1, b, end=True), "OUTPUT"),
               first(await c.infer("seq_state", 5, a, start=True), "OUTPUT"),  # starts over
               first(await c.infer("seq_state", 5, a, end=True), "OUTPUT")]
        assert out == [5, 1, 10, 2, 5, 10]
    run(server, protocol, body)


def test_iterative_short_requests_overtake_long_ones(server, protocol):
    async def body(c):
        finished = []

        async def request(steps, name):
            r = await c.infer("iterative_steps", steps, name="STEPS")
            finished.append(name)
            return r

        long = asyncio.ensure_future(request(60, "long"))
        await asyncio.sleep(0.05)
        short = await request(3, "short")
        long = await long
        assert finished == ["short", "long"]
        assert first(short, "STEP") == 3 and first(long, "STEP") == 60
        # The short request joined the long one's running batch.
        assert first(short, "BATCH") == 2
        assert first(short, "CALL") < first(long, "CALL")
    run(server, protocol, body)


def test_iterative_statistics_count_every_step(server):
    """Triton counts each step of an iterative request as an inference and a success."""
    def counts():
        with closing(httpclient.InferenceServerClient(server.http_url)) as client:
            entry = client.get_inference_statistics("iterative_steps")["model_stats"][0]
        return (entry["inference_count"], entry["execution_count"],
                entry["inference_stats"]["success"]["count"],
                entry["inference_stats"]["queue"]["count"])

    before = counts()

    async def body(c):
        assert first(await c.infer("iterative_steps", 4, name="STEPS"), "STEP") == 4
    run(server, "http", body)
    assert [a - b for a, b in zip(counts(), before)] == [4, 4, 4, 4]


def test_iterative_decoupled_streams_a_response_per_step(server):
    results = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        for rid, steps in (("long", 40), ("short", 4)):
            steps_in = grpcclient.InferInput("STEPS", [1, 1], "INT32")
            steps_in.set_data_from_numpy(np.array([[steps]], dtype=np.int32))
            client.async_stream_infer("iterative_stream", [steps_in], request_id=rid,
                                      enable_empty_final_response=True)
        seen = {"long": [], "short": []}
        order = []
        while len(order) < 2:
            result, error = results.get(timeout=WAIT_S)
            assert error is None, error
            response = result.get_response()
            seen[response.id].append(first(result, "STEP"))
            if response.parameters["triton_final_response"].bool_param:
                order.append(response.id)
        assert seen == {"long": list(range(1, 41)), "short": [1, 2, 3, 4]}
        assert order == ["short", "long"]
    finally:
        client.stop_stream()
        client.close()
