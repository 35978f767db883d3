"""The dynamic batcher end to end: tritonclient (HTTP and gRPC) against the batch_* models,
which report how each execute call was batched (tests/models/README.md), on a server that
sends an instance its next batch only when it is free (--pipeline-below-us=0, as Triton).

Batches form deterministically: requests that wait for a file (their `hold_until` parameter)
first occupy the model's instances; the test then sends the requests under study one by one,
waiting for each to show in nv_inference_pending_request_count (so they are queued, in a known
order), and only then creates the file. Timings are asserted only with wide margins.
"""

import asyncio
import glob
import itertools
import json
import os
import shutil
import tempfile
import time
import urllib.request
from contextlib import closing
from dataclasses import dataclass

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server, stop_server

PROTOCOLS = ("http", "grpc")
MODELS = ("batch_recorder", "batch_parallel", "batch_preferred", "batch_priority", "batch_custom")
SLOTS = 1  # the batches an instance holds, on this module's server
AIO = {"http": httpaio, "grpc": grpcaio}
UNAVAILABLE = {"http": "503", "grpc": "StatusCode.UNAVAILABLE"}


@pytest.fixture(scope="module")
def server(test_repository, tmp_path_factory):
    srv = start_server(test_repository, str(tmp_path_factory.mktemp("batching") / "log"),
                       "--model-control-mode=explicit", *(f"--load-model={m}" for m in MODELS),
                       "--pipeline-below-us=0", wait_models=MODELS)
    yield srv
    stop_server(srv)


@dataclass
class Answer:
    """One request's result, and what the model reported about the call that ran it."""

    sent: float  # time.time() when the client sent the request
    received: float  # ... and when its answer came back
    result: object

    def _first(self, name):
        return self.result.as_numpy(name)[0, 0]

    @property
    def batch(self) -> int:
        return int(self._first("BATCH"))

    @property
    def requests(self) -> int:
        return int(self._first("REQUESTS"))

    @property
    def instance(self) -> bytes:
        return self._first("INSTANCE")

    @property
    def start(self) -> float:
        return float(self._first("START"))

    @property
    def end(self) -> float:
        return float(self._first("END"))


class Scenario:
    """One test's requests to one model, through one protocol's aio client."""

    def __init__(self, server, protocol: str, model: str):
        self.server = server
        self.model = model
        self._mod = AIO[protocol]
        self._client = self._mod.InferenceServerClient(
            server.http_url if protocol == "http" else server.grpc_url)
        self._tags = itertools.count(1)
        self._tasks = []
        self._gate_dir = tempfile.mkdtemp(prefix="shmserve-test-gate-")
        self._gate = os.path.join(self._gate_dir, "open")

    def send(self, rows: int = 1, cols: int = 2, delay: float = None, **options) -> asyncio.Task:
        """Infer INPUT0 [rows, cols] (and DELAY [rows, 1] if given); the task gives an Answer."""
        data = np.full((rows, cols), next(self._tags), np.float32)
        inputs = [self._input("INPUT0", data)]
        if delay is not None:
            inputs.append(self._input("DELAY", np.full((rows, 1), delay, np.float32)))
        task = asyncio.create_task(self._infer(inputs, data, options))
        self._tasks.append(task)
        return task

    async def _infer(self, inputs, data, options) -> Answer:
        sent = time.time()
        result = await self._client.infer(self.model, inputs, **options)
        answer = Answer(sent, time.time(), result)
        # In a batch, every request still gets its own rows back.
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
        return answer

    def _input(self, name, array):
        tensor = self._mod.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        return tensor

    async def hold(self, instances: int = 1, rows: int = 1, then: float = 0.0) -> list:
        """Fill every batch slot of the instances with a request that waits for release()
        and then sleeps `then` seconds; requests sent meanwhile wait in the batcher's queue."""
        held = []
        for i in range(instances * SLOTS):
            held.append(self.send(rows=rows, delay=then, parameters={"hold_until": self._gate}))
            await asyncio.sleep(0.05)  # each arrives before the next, and finds a free slot
            # The next one is sent once this one runs, so the two cannot form one batch.
            await self._holding(min(i + 1, instances))
        return held

    async def _holding(self, instances: int) -> None:
        """Wait until `instances` instances run a held request (the model marks each)."""
        deadline = time.monotonic() + 10
        while len(glob.glob(self._gate + ".held-*")) < instances:
            if time.monotonic() > deadline:
                raise AssertionError(f"fewer than {instances} instances hold a request")
            await asyncio.sleep(0.005)

    def release(self) -> None:
        open(self._gate, "w").close()

    async def queue(self, *requests: dict) -> list:
        """Send the requests (send() arguments) in this order, each queued before the next."""
        already = await asyncio.to_thread(pending_requests, self.server, self.model)
        sent = []
        for request in requests:
            sent.append(self.send(**request))
            await self.queued(already + len(sent))
        return sent

    async def queued(self, count: int) -> None:
        """Wait until `count` requests of the model wait in its queue."""
        deadline = time.monotonic() + 10
        while True:
            pending = await asyncio.to_thread(pending_requests, self.server, self.model)
            if pending >= count:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{pending} of {count} requests queued for '{self.model}'")
            await asyncio.sleep(0.005)

    async def close(self) -> None:
        self.release()
        try:
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._client.close()
        finally:
            shutil.rmtree(self._gate_dir)


def pending_requests(server, model: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith("nv_inference_pending_request_count{") and f'model="{model}"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError(f"no nv_inference_pending_request_count for '{model}'")


def run(server, protocol, model, body):
    """`await body(scenario)` on a fresh event loop; every request it sent has ended after."""
    async def main():
        scenario = Scenario(server, protocol, model)
        try:
            return await body(scenario)
        finally:
            await scenario.close()
    return asyncio.run(main())


def model_stats(server, protocol: str, model: str) -> dict:
    """Counts of the model's version from the statistics extension, the same for both protocols."""
    if protocol == "http":
        with closing(httpclient.InferenceServerClient(server.http_url)) as client:
            entry = client.get_inference_statistics(model)["model_stats"][0]
    else:
        # JSON of the protobuf: 64-bit numbers are strings, zero fields are left out.
        with closing(grpcclient.InferenceServerClient(server.grpc_url)) as client:
            entry = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return {
        "execution_count": int(entry.get("execution_count", 0)),
        "inference_count": int(entry.get("inference_count", 0)),
        "batches": {int(b["batch_size"]): int(b["compute_infer"].get("count", 0))
                    for b in entry.get("batch_stats", [])},
    }


def stats_delta(before: dict, after: dict) -> dict:
    batches = {size: n - before["batches"].get(size, 0) for size, n in after["batches"].items()}
    return {"execution_count": after["execution_count"] - before["execution_count"],
            "inference_count": after["inference_count"] - before["inference_count"],
            "batches": {size: n for size, n in batches.items() if n}}


def assert_unavailable(outcome, protocol: str, message: str) -> None:
    assert isinstance(outcome, InferenceServerException), f"expected a rejection, got {outcome!r}"
    assert outcome.status() == UNAVAILABLE[protocol]
    assert outcome.message() == message


# -- batches form ------------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_queued_requests_run_as_one_batch(server, protocol):
    async def body(s):
        held = await s.hold()
        batch = await s.queue(*[{}] * 6)
        s.release()
        return await asyncio.gather(*held), await asyncio.gather(*batch)

    before = model_stats(server, protocol, "batch_recorder")
    held, batch = run(server, protocol, "batch_recorder", body)
    after = model_stats(server, protocol, "batch_recorder")
    assert [(a.batch, a.requests) for a in held] == [(1, 1)] * SLOTS
    assert [(a.batch, a.requests) for a in batch] == [(6, 6)] * 6
    assert len({a.start for a in batch}) == 1  # one execute call
    assert stats_delta(before, after) == {
        "execution_count": SLOTS + 1, "inference_count": SLOTS + 6,
        "batches": {1: SLOTS, 6: 1}}


def test_requests_count_for_their_batch_size_up_to_max_batch_size(server):
    # max_batch_size 8: 3 + 3 fit, a third 3 would make 9 and starts the next batch.
    async def body(s):
        await s.hold()
        tasks = await s.queue(*({"rows": rows} for rows in (3, 3, 3, 1)))
        s.release()
        return await asyncio.gather(*tasks)

    before = model_stats(server, "http", "batch_recorder")
    answers = run(server, "http", "batch_recorder", body)
    after = model_stats(server, "http", "batch_recorder")
    assert [(a.batch, a.requests) for a in answers] == [(6, 2), (6, 2), (4, 2), (4, 2)]
    assert stats_delta(before, after) == {
        "execution_count": SLOTS + 2, "inference_count": SLOTS + 10,
        "batches": {1: SLOTS, 6: 1, 4: 1}}


def test_different_shapes_do_not_batch_together(server):
    async def body(s):
        await s.hold()
        tasks = await s.queue(*({"cols": cols} for cols in (2, 2, 3, 2)))
        s.release()
        return await asyncio.gather(*tasks)

    answers = run(server, "grpc", "batch_recorder", body)
    # A batch is a run of queued requests of one shape: [2, 2], then [3], then [2].
    assert [a.requests for a in answers] == [2, 2, 1, 1]
    assert answers[0].start == answers[1].start < answers[2].start < answers[3].start


def test_ragged_input_batches_different_shapes(server):
    async def body(s):
        await s.hold()
        tasks = await s.queue(*({"cols": cols} for cols in (2, 3, 1)))
        s.release()
        return await asyncio.gather(*tasks)

    answers = run(server, "http", "batch_custom", body)
    assert [(a.batch, a.requests) for a in answers] == [(3, 3)] * 3


def test_custom_strategy_decides_who_joins_a_batch(server):
    # batch_strategy.py admits at most 6 INPUT0 elements per batch; a request that exceeds
    # that on its own still runs, alone.
    async def body(s):
        await s.hold()
        tasks = await s.queue(*({"cols": cols} for cols in (4, 2, 3, 1, 7)))
        s.release()
        return await asyncio.gather(*tasks)

    answers = run(server, "grpc", "batch_custom", body)
    assert [a.requests for a in answers] == [2, 2, 2, 2, 1]
    starts = [a.start for a in answers]
    assert starts[0] == starts[1] < starts[2] == starts[3] < starts[4]


def test_two_instances_run_two_batches_at_once(server):
    async def body(s):
        # The held requests of the second round sleep on, so that each instance takes one
        # of the two batches as its first held request ends.
        await s.hold(instances=2, then=0.3)
        tasks = await s.queue(*[{"delay": 0.4}] * 8)  # max_batch_size 4: two batches
        s.release()
        return await asyncio.gather(*tasks)

    answers = run(server, "http", "batch_parallel", body)
    assert [(a.batch, a.requests) for a in answers] == [(4, 4)] * 8
    batches = {a.instance: (a.start, a.end) for a in answers}
    assert len(batches) == 2
    (start0, end0), (start1, end1) = batches.values()
    assert max(start0, start1) < min(end0, end1)  # they ran at the same time


def test_only_an_instance_with_short_batches_is_sent_the_next_while_it_runs_one(
        test_repository, tmp_path):
    """With the default --pipeline-below-us: an instance that knows only short batches takes
    a second one behind the one it runs; after a long batch, the next waits in the queue
    until the instance is free, so that whatever arrives meanwhile joins it (as Triton)."""
    srv = start_server(test_repository, str(tmp_path / "log"), "--model-control-mode=explicit",
                       "--load-model=batch_recorder", wait_models=("batch_recorder",))

    async def second_while_held(s, pipelined: bool):
        held = s.send(delay=0.0, parameters={"hold_until": s._gate})
        await asyncio.sleep(0.1)  # running, and waiting for the file
        # In the first round the second batch is long too (50 ms), so that what the
        # instance knows afterwards is long batches only.
        second = s.send(delay=0.05) if pipelined else s.send()
        if pipelined:
            await asyncio.sleep(0.2)
            assert await asyncio.to_thread(pending_requests, s.server, s.model) == 0
        else:
            await s.queued(1)
        s.release()
        return await held, await second

    try:
        # A fresh instance: nothing known, so the second goes behind the first at once.
        first, second = run(srv, "http", "batch_recorder", lambda s: second_while_held(s, True))
        # Those batches took over 50 ms each: from now on, one batch at a time.
        third, fourth = run(srv, "http", "batch_recorder", lambda s: second_while_held(s, False))
    finally:
        stop_server(srv)
    for held, later in ((first, second), (third, fourth)):
        assert (held.requests, later.requests) == (1, 1)
        assert later.start >= held.end


# -- preferred sizes and the queue delay ------------------------------------------------------

def test_a_lone_request_waits_for_the_queue_delay(server):
    # batch_preferred holds a batch that is short of a preferred size for up to 1 s.
    answer = run(server, "http", "batch_preferred", lambda s: s.send())
    assert answer.requests == 1
    assert answer.start - answer.sent > 0.8


def test_a_request_completing_a_preferred_size_is_sent_at_once(server):
    async def body(s):
        [first] = await s.queue({})
        second = s.send()
        return await first, await second

    first, second = run(server, "grpc", "batch_preferred", body)
    assert first.requests == second.requests == 2
    assert first.start - first.sent < 0.6  # far less than the 1 s queue delay


def test_the_largest_preferred_size_leaves_first(server):
    # Preferred sizes 2 and 4: of six queued requests, four leave together, then two.
    async def body(s):
        await s.hold(rows=4)  # a batch of 4 is preferred: it never waits
        tasks = await s.queue(*[{}] * 6)
        s.release()
        return await asyncio.gather(*tasks)

    answers = run(server, "http", "batch_preferred", body)
    assert [a.requests for a in answers] == [4, 4, 4, 4, 2, 2]


# -- priorities and the queue policies ---------------------------------------------------------

@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_higher_priority_overtakes_and_a_level_stays_in_order(server, protocol):
    # batch_priority: max_batch_size 1, levels 1 (highest) to 7, default 3.
    sent = {"low0": 0, "mid0": 2, "high0": 1, "low1": 3, "mid1": 2, "beyond": 9}

    async def body(s):
        await s.hold()
        tasks = await s.queue(*({"priority": p} for p in sent.values()))
        s.release()
        return [a.start for a in await asyncio.gather(*tasks)]

    starts = run(server, protocol, "batch_priority", body)
    # Priority 0 and priorities beyond the levels take the default level, 3.
    assert [name for _, name in sorted(zip(starts, sent))] == \
        ["high0", "mid0", "mid1", "low0", "low1", "beyond"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_full_queue_rejects_at_once(server, protocol):
    # Level 1 holds one request; the other levels have no limit.
    async def body(s):
        await s.hold()
        [first] = await s.queue({"priority": 1})
        others = await s.queue({"priority": 3}, {})
        with pytest.raises(InferenceServerException) as rejected:
            await s.send(priority=1)
        s.release()
        return rejected.value, await first, await asyncio.gather(*others)

    rejection, first, others = run(server, protocol, "batch_priority", body)
    assert_unavailable(rejection, protocol, "Exceeds maximum queue size")
    assert first.requests == 1 and len(others) == 2


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_queue_timeouts_reject_with_unavailable(server, protocol):
    # The `timeout` request parameter is in microseconds.
    expired = {
        "level 4 default 200 ms": dict(priority=4),
        "level 4 cannot be raised": dict(priority=4, timeout=10_000_000),
        "level 5 lowered to 100 ms": dict(priority=5, timeout=100_000),
    }
    served = {
        "level 5 default 10 s": dict(priority=5),
        "level 3 allows no override": dict(priority=3, timeout=100_000),
    }

    async def body(s):
        await s.hold()
        waiting = await s.queue(*served.values())
        timing_out = [s.send(**options) for options in expired.values()]
        await asyncio.wait(timing_out, timeout=10)
        s.release()
        return (await asyncio.gather(*timing_out, return_exceptions=True),
                await asyncio.gather(*waiting, return_exceptions=True))

    rejections, answers = run(server, protocol, "batch_priority", body)
    for outcome in rejections:
        assert_unavailable(outcome, protocol, "Request timeout expired")
    for case, outcome in zip(served, answers):
        assert isinstance(outcome, Answer), f"{case}: {outcome!r}"


def test_a_request_timeout_needs_a_default_timeout_to_lower(server):
    async def body(s):
        await s.hold()
        [task] = await s.queue({"priority": 7, "timeout": 100_000})
        await asyncio.sleep(0.3)  # well past the 100 ms asked for
        s.release()
        return await task

    assert run(server, "http", "batch_priority", body).requests == 1


def test_delay_action_moves_a_timed_out_request_behind_its_level(server):
    # Level 6 delays a request that outstays its queue timeout (lowered here to 50 ms): it
    # goes behind the rest of its level, still ahead of lower levels, and runs.
    async def body(s):
        await s.hold()
        tasks = await s.queue({"priority": 6, "timeout": 50_000}, {"priority": 6}, {"priority": 7})
        await asyncio.sleep(0.3)
        s.release()
        return [a.start for a in await asyncio.gather(*tasks)]

    late, on_time, lower = run(server, "grpc", "batch_priority", body)
    assert on_time < late < lower


# -- preserve_ordering -------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_preserve_ordering_answers_in_arrival_order(server, protocol):
    # batch_parallel has two instances: the second request runs on the other one and finishes
    # first, but its answer waits for the first request's.
    async def body(s):
        slow = s.send(delay=0.5)
        await asyncio.sleep(0.1)
        fast = s.send(delay=0.0)
        return await slow, await fast

    slow, fast = run(server, protocol, "batch_parallel", body)
    assert slow.instance != fast.instance
    assert fast.end < slow.end <= fast.received


# -- statistics --------------------------------------------------------------------------------

def test_statistics_report_batch_sizes_on_every_endpoint(server):
    def http_get(path):
        with urllib.request.urlopen(f"http://{server.http_url}{path}", timeout=5) as r:
            return json.loads(r.read())

    def recorder(body):
        [entry] = [m for m in body["model_stats"] if m["name"] == "batch_recorder"]
        return entry

    run(server, "http", "batch_recorder", lambda s: s.send())  # at least one execution
    entries = [recorder(http_get(path)) for path in (
        "/v2/models/stats", "/v2/models/batch_recorder/stats",
        "/v2/models/batch_recorder/versions/1/stats")]
    assert entries[0] == entries[1] == entries[2]
    entry = entries[0]
    assert entry["version"] == "1"
    sizes = [b["batch_size"] for b in entry["batch_stats"]]
    assert sizes == sorted(sizes) and 1 in sizes
    durations = ("compute_input", "compute_infer", "compute_output")
    for b in entry["batch_stats"]:
        assert set(b) == {"batch_size", *durations}
        assert all(type(b[d]["count"]) is int and b[d]["count"] > 0 for d in durations)
    # Every execution is counted under the size of its batch.
    executions = sum(b["compute_infer"]["count"] for b in entry["batch_stats"])
    assert executions == entry["execution_count"]

    with closing(grpcclient.InferenceServerClient(server.grpc_url)) as client:
        for name, version in (("", ""), ("batch_recorder", ""), ("batch_recorder", "1")):
            stats = client.get_inference_statistics(name, version)
            [g] = [m for m in stats.model_stats if m.name == "batch_recorder"]
            assert g.execution_count == entry["execution_count"]
            got = [(b.batch_size, b.compute_infer.count, b.compute_infer.ns) for b in g.batch_stats]
            assert got == [(b["batch_size"], b["compute_infer"]["count"], b["compute_infer"]["ns"])
                           for b in entry["batch_stats"]]


def test_a_broken_batch_strategy_makes_only_its_model_unavailable(tmp_path):

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    repo = tmp_path / "repo"
    repo.mkdir()
    os.symlink(os.path.join(root, "..", "model_repository", "add_sub"), repo / "add_sub")
    broken = repo / "broken_strategy"
    shutil.copytree(os.path.join(root, "models", "batch_recorder"), broken, symlinks=False)
    config = (broken / "config.pbtxt").read_text().replace('"batch_recorder"', '"broken_strategy"')
    (broken / "config.pbtxt").write_text(config)
    (broken / "batch_strategy.py").write_text("raise RuntimeError('no strategy today')\n")
    srv = start_server(str(repo), str(tmp_path / "log"), wait_models=("add_sub",))
    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        assert client.is_model_ready("add_sub")
        assert not client.is_model_ready("broken_strategy")
        entry = next(m for m in client.get_model_repository_index()
                     if m["name"] == "broken_strategy")
        assert entry["state"] == "UNAVAILABLE"
        assert "batch_strategy.py" in entry["reason"]
        assert "no strategy today" in entry["reason"]
    finally:
        client.close()  # an open connection would hold the server's stop (as Triton's)
        stop_server(srv)
