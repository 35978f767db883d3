"""Custom metrics, the families models declare through pb_utils: added up across instances at
scrape time, a family shown as first declared and only while it has series, a scrape waiting
for its own ask's answer from the worker, and the worker's metrics thread answering each ask
with the values as they are."""

import asyncio
import os
import threading
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from shmserve.dispatch.worker import WorkerHandle
from shmserve.errors import ServerError
from shmserve.ipc import messages
from shmserve.observability.metrics import CustomMetricsCollector, exposition
from shmserve.registry import Registry
from tests.unit.observability.metrics_helpers import FakeRegistry, model, scrape
from workers import metrics_report
from workers import triton_python_backend_utils as pb_utils
from workers.model_api import metrics as metrics_module


def instance(*families):
    return SimpleNamespace(custom_metrics=list(families))


def test_custom_metrics_add_up_across_instances_and_a_gauge_shows_its_latest_set():
    bounds = [0.1, 1.0]
    first = instance(
        ["requests", "Requests seen", 0, [[{"kind": "a"}, 2.0, 10.0], [{"kind": "b"}, 1.0, 10.0]]],
        ["depth", "Queue depth", 1, [[{}, 5.0, 10.0]]],
        ["latency", "Latency", 2, [[{}, [bounds, [1, 0, 1], 2.05, 2], 10.0]]])
    second = instance(
        ["requests", "Requests seen", 0, [[{"kind": "a"}, 3.0, 11.0]]],
        ["depth", "Queue depth", 1, [[{}, 7.0, 12.0]]],
        ["latency", "Latency", 2, [[{}, [bounds, [0, 1, 0], 0.5, 1], 11.0]]],
        ["requests_gauge_clash", "x", 1, []])
    other_model = instance(["depth", "Queue depth", 1, [[{}, 6.0, 11.5]]])
    samples = scrape(CustomMetricsCollector(FakeRegistry(
        model("m", instances=[first, second]), model("n", instances=[other_model]), model("o"))))
    assert samples[("requests", (("kind", "a"),))] == 5.0
    assert samples[("requests", (("kind", "b"),))] == 1.0
    assert samples[("depth", ())] == 7.0  # set last (t=12) by the second instance
    buckets = {labels: v for (name, labels), v in samples.items() if name == "latency_bucket"}
    assert buckets == {(("le", "0.1"),): 1.0, (("le", "1"),): 2.0, (("le", "+Inf"),): 3.0}
    assert samples[("latency_count", ())] == 3.0
    assert samples[("latency_sum", ())] == pytest.approx(2.55)
    # The reports were not changed by adding them up.
    assert first.custom_metrics[2][3][0][1][1] == [1, 0, 1]


def test_a_family_shows_as_first_declared_and_only_while_it_has_series():
    """As Triton's registry: a name keeps the first kind and description any model gave it,
    another kind is refused, and a family without series does not show."""
    registry = Registry()
    registry.declare_metric_family("f", "first words", 0)
    registry.declare_metric_family("f", "later words", 0)
    with pytest.raises(ServerError, match="^Family name already exists with different type$"):
        registry.declare_metric_family("f", "first words", 1)
    registry.declare_metric_family("empty", "e", 1)
    fake = FakeRegistry(model("m", instances=[instance(["f", "later words", 0, [[{}, 1.0, 1.0]]],
                                                       ["empty", "e", 1, []])]))
    fake.metric_families = registry.metric_families
    prom = CollectorRegistry(auto_describe=False)
    prom.register(CustomMetricsCollector(fake))
    text = exposition(prom).decode()
    assert "# HELP f first words\n# TYPE f counter\nf 1.0\n" in text
    assert "empty" not in text


def handle():
    return WorkerHandle(model_name="m", model_version=1, model_dir="", model_repository="",
                        model_config={}, instance_name="m_0", instance_kind="CPU", device_id=0)


def test_a_scrape_waits_for_the_answer_to_its_own_ask():
    async def main():
        worker = handle()
        worker._loop = asyncio.get_running_loop()
        worker.alive = True
        worker._metrics.fd = os.eventfd(0, os.EFD_NONBLOCK)
        try:
            first = asyncio.ensure_future(worker.fresh_custom_metrics(5))
            await asyncio.sleep(0)
            second = asyncio.ensure_future(worker.fresh_custom_metrics(5))
            await asyncio.sleep(0)
            assert os.eventfd_read(worker._metrics.fd) == 2  # one write per ask
            families = [["f", "d", 0, [[{}, 1.0, 1.0]]]]
            worker._on_message(messages.MetricsReport(1, families))  # the first ask's answer
            await asyncio.wait_for(first, 1)
            assert not second.done() and worker.custom_metrics == families
            worker._on_message(messages.MetricsReport(2, None))  # unchanged since
            await asyncio.wait_for(second, 1)
            assert worker.custom_metrics == families
            # A worker that does not answer: the scrape goes on with its last values.
            await asyncio.wait_for(worker.fresh_custom_metrics(0.05), 1)
            assert not worker._metrics.waiters
            # One whose process is gone answers every waiting scrape at once.
            third = asyncio.ensure_future(worker.fresh_custom_metrics(5))
            await asyncio.sleep(0)
            worker._metrics.wake()
            await asyncio.wait_for(third, 1)
        finally:
            os.close(worker._metrics.fd)
    asyncio.run(main())


class Sent:
    def __init__(self):
        self.frames = []
        self.arrived = threading.Semaphore(0)
        self.closed = False

    def send(self, msg):
        if self.closed:
            self.arrived.release()
            raise BrokenPipeError  # the front is gone: the thread ends
        self.frames.append(msg)
        self.arrived.release()


def test_the_workers_metrics_thread_answers_each_ask_with_values_as_they_are(monkeypatch):
    monkeypatch.setattr(metrics_module, "_registry", {})
    family = pb_utils.MetricFamily("g", "gauge", pb_utils.MetricFamily.GAUGE)
    gauge = family.Metric(labels={"k": "v"})
    channel, fd = Sent(), os.eventfd(0)
    try:
        metrics_report.start(channel, fd)
        gauge.set(3)
        os.eventfd_write(fd, 1)
        assert channel.arrived.acquire(timeout=5)
        assert channel.frames[-1].answered == 1
        assert channel.frames[-1].families[0][3][0][:2] == [{"k": "v"}, 3.0]
        os.eventfd_write(fd, 1)
        assert channel.arrived.acquire(timeout=5)
        assert (channel.frames[-1].answered, channel.frames[-1].families) == (2, None)
        gauge.set(4)
        os.eventfd_write(fd, 1)
        assert channel.arrived.acquire(timeout=5)
        assert channel.frames[-1].families[0][3][0][1] == 4.0
    finally:
        channel.closed = True
        os.eventfd_write(fd, 1)
        assert channel.arrived.acquire(timeout=5)
        os.close(fd)
