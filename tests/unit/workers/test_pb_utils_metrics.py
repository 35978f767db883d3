"""Our `triton_python_backend_utils` metrics: MetricFamily and its counters, gauges and
histograms, the errors in the words of Triton's Python backend, a family's life (deleted,
redeclared, its name keeping its kind), its declaration to the front, and the snapshots sent
only after a change."""

import re

import numpy as np
import pytest

import workers.triton_python_backend_utils as pb_utils
from workers.model_api import metrics as metrics_module
from workers.model_api.context import CONTEXT


# --- metrics ----------------------------------------------------------------------------------
# Errors as Triton's Python backend words them (src/metric.cc, src/metric_family.cc, and the
# core's messages behind "Failed to process the request for model '<instance>'").


CLEARED = ("Invalid metric operation as the corresponding 'MetricFamily' has been deleted. "
           "The 'MetricFamily' object should be deleted AFTER its corresponding 'Metric' "
           "objects have been deleted.")


def refused(action, message):
    return f"{action}: Failed to process the request for model 'm_0_0', message: {message}"


@pytest.fixture
def metrics(monkeypatch):
    """A process of its own: no family declared yet, instance m_0_0."""
    monkeypatch.setattr(metrics_module, "_registry", {})
    monkeypatch.setattr(CONTEXT, "instance_name", "m_0_0")
    return pb_utils


def raises_exactly(text):
    return pytest.raises(pb_utils.TritonModelException, match=f"^{re.escape(text)}$")


def test_counter_and_gauge(metrics):
    counter = pb_utils.MetricFamily("requests_total", "requests", pb_utils.MetricFamily.COUNTER)
    metric = counter.Metric(labels={"model": "m"})
    metric.increment(2)
    metric.increment(np.float32(1.5))
    assert metric.value() == 3.5 and type(metric.value()) is float
    assert counter.Metric(labels={"model": "m"}) is metric
    assert counter.Metric(labels={"model": "other"}).value() == 0
    with raises_exactly(refused("Failed to increment metric value",
                                "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented "
                                "monotonically by non-negative values.")):
        metric.increment(-1)
    with raises_exactly(refused("Failed to set metric value",
                                "TRITONSERVER_METRIC_KIND_COUNTER does not support Set")):
        metric.set(1)
    with raises_exactly(refused("Failed to observe metric value",
                                "TRITONSERVER_METRIC_KIND_COUNTER does not support Observe")):
        metric.observe(1)
    with pytest.raises(TypeError):
        metric.increment("1")

    gauge_family = pb_utils.MetricFamily("temp", "temperature", pb_utils.MetricFamily.GAUGE)
    gauge = gauge_family.Metric()
    gauge.set(10)
    gauge.increment(-3)
    assert gauge.value() == 7
    with raises_exactly(refused("Failed to observe metric value",
                                "TRITONSERVER_METRIC_KIND_GAUGE does not support Observe")):
        gauge.observe(1)


def test_histogram(metrics):
    family = pb_utils.MetricFamily("latency", "latency", pb_utils.MetricFamily.HISTOGRAM)
    histogram = family.Metric(labels={}, buckets=[1, 5])
    for value in (0.5, 1, 3, 7):
        histogram.observe(value)
    _, families = pb_utils._metrics_snapshot()
    assert families == [["latency", "latency", 2, [[{}, [[1.0, 5.0], [2, 1, 1], 11.5, 4],
                                                    families[0][3][0][2]]]]]
    with raises_exactly(refused("Failed to get metric value",
                                "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value")):
        histogram.value()
    with raises_exactly(refused("Failed to increment metric value",
                                "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment")):
        histogram.increment(1)
    with raises_exactly(refused("Failed to set metric value",
                                "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Set")):
        histogram.set(1)
    only_inf = family.Metric(labels={"empty": "yes"}, buckets=[])  # one bucket: +Inf
    only_inf.observe(3)
    assert only_inf._series.counts == [1]


def test_invalid_buckets_and_labels(metrics):
    """Triton's QA model custom_metrics (test_histogram_args) and the stub's checks."""
    family = pb_utils.MetricFamily("h", "h", pb_utils.MetricFamily.HISTOGRAM)
    for no_buckets in ({"labels": {}}, {"labels": {}, "buckets": None}):
        with raises_exactly("Failed to create metric. Missing required buckets."):
            family.Metric(**no_buckets)
    for unsorted in ([2.5, 0.1, 1.0, 10.0, 5.0], [1, 1, 2, 5, 5]):
        with raises_exactly(refused("Error when creating Metric",
                                    "Bucket Boundaries must be strictly sorted")):
            family.Metric(labels={}, buckets=unsorted)
    with raises_exactly("Failed to create metric. Buckets must be a list."):
        family.Metric(labels={}, buckets=(1, 2))
    with raises_exactly("Failed to create metric. Labels must be a dictionary."):
        family.Metric(labels=[("a", "b")], buckets=[1])
    with pytest.raises(pb_utils.TritonModelException, match="labels"):
        family.Metric(labels={"a": 1}, buckets=[1])
    for kind in (pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE):
        other = pb_utils.MetricFamily(f"k{int(kind)}", "k", kind)
        with raises_exactly("Failed to create metric. Unexpected buckets found."):
            other.Metric(buckets=[1])
    # A failed creation leaves no series behind.
    assert pb_utils._metrics_snapshot()[1] == []


def test_a_metric_is_unusable_once_its_family_is_deleted(metrics):
    for kind in (pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE,
                 pb_utils.MetricFamily.HISTOGRAM):
        family = pb_utils.MetricFamily(f"life{int(kind)}", "lifetime", kind)
        metric = family.Metric(labels={"a": "b"},
                               buckets=[1] if kind == pb_utils.MetricFamily.HISTOGRAM else None)
        del family
        for call, action in ((lambda metric=metric: metric.increment(10), "increment"),
                             (lambda metric=metric: metric.set(10), "set"),
                             (lambda metric=metric: metric.observe(10), "observe"),
                             (metric.value, "get")):
            with raises_exactly(f"Failed to {action} metric value: {CLEARED}"):
                call()
    assert pb_utils._metrics_snapshot()[1] == []  # and their series are gone


def test_a_redeclared_family_is_the_same_family(metrics):
    """As Triton's registry merges them: the first description stays, series are shared, and
    a series goes with the last family object holding a metric of it."""
    first = pb_utils.MetricFamily("dup", "first description", pb_utils.MetricFamily.COUNTER)
    second = pb_utils.MetricFamily("dup", "second description", pb_utils.MetricFamily.COUNTER)
    first.Metric(labels={"k": "1"}).increment(2)
    assert second.Metric(labels={"k": "1"}).value() == 2
    second.Metric(labels={"k": "2"})
    del first
    (family,) = pb_utils._metrics_snapshot()[1]
    assert family[:3] == ["dup", "first description", 0]
    assert sorted(s[0]["k"] for s in family[3]) == ["1", "2"]
    del second
    assert pb_utils._metrics_snapshot()[1] == []
    again = pb_utils.MetricFamily("dup", "third", pb_utils.MetricFamily.COUNTER)
    assert again.Metric(labels={"k": "1"}).value() == 0  # a new series
    assert pb_utils._metrics_snapshot()[1][0][1] == "first description"


def test_a_family_name_keeps_its_kind(metrics):
    counter = pb_utils.MetricFamily("clash", "c", pb_utils.MetricFamily.COUNTER)
    for kind in (pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.HISTOGRAM):
        with raises_exactly(refused("Error when creating MetricFamily",
                                    "Family name already exists with different type")):
            pb_utils.MetricFamily("clash", "c", kind)
    del counter  # the name stays in the registry, with its kind
    with raises_exactly(refused("Error when creating MetricFamily",
                                "Family name already exists with different type")):
        pb_utils.MetricFamily("clash", "c", pb_utils.MetricFamily.GAUGE)


def test_a_new_family_is_declared_to_the_front(metrics, monkeypatch):
    """The front keeps the server's names (another model's family may hold one)."""
    calls = []

    def control(kind, args):
        calls.append((kind, args))
        if args["name"] == "taken":
            raise pb_utils.TritonModelException("Family name already exists with different type")

    monkeypatch.setattr(CONTEXT, "server_calls", object())
    monkeypatch.setattr(metrics_module, "_control", control)
    pb_utils.MetricFamily("mine", "d", pb_utils.MetricFamily.GAUGE)
    pb_utils.MetricFamily("mine", "d", pb_utils.MetricFamily.GAUGE)  # known here: no call
    assert calls == [("metric_family", {"name": "mine", "description": "d", "kind": 1})]
    with raises_exactly(refused("Error when creating MetricFamily",
                                "Family name already exists with different type")):
        pb_utils.MetricFamily("taken", "d", pb_utils.MetricFamily.GAUGE)
    assert "taken" not in metrics_module._registry


def test_snapshots_resend_only_after_a_change(metrics):
    family = pb_utils.MetricFamily("s", "s", pb_utils.MetricFamily.GAUGE)
    metric = family.Metric()
    changes, families = pb_utils._metrics_snapshot()
    assert families[0][3][0][1] == 0.0
    assert pb_utils._metrics_snapshot(changes) == (changes, None)
    metric.set(4)
    changes, families = pb_utils._metrics_snapshot(changes)
    assert families[0][3][0][1] == 4.0
