"""What the test_metrics_* modules share: a registry of fake model versions (FakeRegistry,
`model`), `scrape`, which reads what collectors expose as {(sample name, labels): value}, the
labels LABELS of model m version 1, and MS, a millisecond in nanoseconds."""

from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from shmserve.observability.metrics import exposition
from shmserve.observability.stats import ModelStats
from tests.conftest import metric_samples


MS = 1_000_000  # ns


class FakeRegistry:
    def __init__(self, *versions):
        self._versions = versions
        self.metric_families = {}

    def all_versions(self):
        return list(self._versions)


def model(name="m", stats=None, instances=None, cache=False, tags=None, decoupled=False):
    pool = None if instances is None else SimpleNamespace(instances=instances)
    config = SimpleNamespace(response_cache=SimpleNamespace(enable=cache),
                             metric_tags=tags or {},
                             model_transaction_policy=SimpleNamespace(decoupled=decoupled))
    return SimpleNamespace(name=name, version=1, load_seconds=0.25, stats=stats or ModelStats(),
                           pool=pool, config=config)


def scrape(*collectors) -> dict:
    """{(sample name, sorted labels): value} of what the collectors expose."""
    prom = CollectorRegistry(auto_describe=False)
    for c in collectors:
        prom.register(c)
    return metric_samples(exposition(prom).decode())


LABELS = (("model", "m"), ("version", "1"))
