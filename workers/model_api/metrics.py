"""Custom metrics: MetricFamily and its Metrics, and the snapshot the worker reports.

Values live in this process; the front reads them when /metrics is scraped (see
workers/metrics_report.py), so an update costs no message. Errors read as Triton's stub words
them: its own checks plainly, its server's refusals behind the stub's prefix.
"""

import bisect
import enum
import threading
import time

from workers.model_api.context import CONTEXT
from workers.model_api.errors import TritonModelException
from workers.model_api.server import _control


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


_KIND_NAMES = ("COUNTER", "GAUGE", "HISTOGRAM")
_CLEARED = ("Invalid metric operation as the corresponding 'MetricFamily' has been deleted. "
            "The 'MetricFamily' object should be deleted AFTER its corresponding 'Metric' "
            "objects have been deleted.")

# Every family name declared in this process. As in Triton's registry a name stays for good,
# with its first description and kind, while its series go with the last family object
# that made them.
_registry: dict = {}
_registry_lock = threading.Lock()
_metric_changes = 0  # bumped by every change a snapshot shows: unchanged values are not resent


def _refused(action: str, message: str) -> TritonModelException:
    """A refusal of Triton's server as its stub relays it: `action` is the stub's prefix."""
    return TritonModelException(f"{action}: Failed to process the request for model "
                                f"'{CONTEXT.instance_name}', message: {message}")


def _unsupported(kind: int, operation: str) -> str:
    return f"TRITONSERVER_METRIC_KIND_{_KIND_NAMES[kind]} does not support {operation}"


def _double(value) -> float:
    """`value` as the C++ double Triton's binding takes (a str is refused, not parsed)."""
    if type(value) is float:
        return value
    if isinstance(value, (str, bytes, bytearray)):
        raise TypeError(f"a metric value must be a number, found {type(value).__name__}")
    return float(value)


def _metrics_snapshot(since=None) -> tuple:
    """(changes so far, families), families None when nothing changed since the count
    `since`: [[name, description, kind, [[labels, value, updated], ...]], ...], families
    without series left out (Triton shows none); a histogram's value is [bucket bounds,
    counts per bucket and +Inf, sum, count]."""
    changes = _metric_changes  # read first: a change made while copying is sent next time too
    if changes == since:
        return changes, None
    out = []
    for family in list(_registry.values()):
        with family.lock:
            series = [[dict(s.labels), s.snapshot(), s.updated] for s in family.series.values()]
        if series:
            out.append([family.name, family.description, int(family.kind), series])
    return changes, out


def _changed() -> None:
    global _metric_changes
    _metric_changes += 1


class _Family:
    """One family name of this process, shared by every MetricFamily object of that name."""

    __slots__ = ("name", "description", "kind", "lock", "series")

    def __init__(self, name: str, description: str, kind: MetricKind):
        self.name = name
        self.description = description
        self.kind = kind
        # Reentrant: a MetricFamily collected by the GC inside a locked section takes it again.
        self.lock = threading.RLock()
        self.series: dict = {}  # sorted label items -> _Series


class _Series:
    """One labelled series; `users` counts the MetricFamily objects holding a Metric of it."""

    __slots__ = ("labels", "value", "updated", "bounds", "counts", "count", "users")

    def __init__(self, labels: dict, bounds):
        self.labels = labels
        self.value = 0.0  # a histogram's sum
        self.updated = time.monotonic()  # one clock for all processes: the newest gauge wins
        self.bounds = bounds
        self.counts = None if bounds is None else [0] * (len(bounds) + 1)  # last: +Inf
        self.count = 0
        self.users = 0

    def snapshot(self):
        if self.bounds is None:
            return self.value
        return [self.bounds, list(self.counts), self.value, self.count]


class Metric:
    """One labelled series of a MetricFamily. Unusable once that MetricFamily object is
    deleted, as in Triton."""

    __slots__ = ("_family", "_series")

    def __init__(self, family: _Family, series: _Series):
        self._family = family
        self._series = series  # None once cleared

    def increment(self, value):
        series = self._series
        if series is None:
            raise TritonModelException("Failed to increment metric value: " + _CLEARED)
        value = _double(value)
        family = self._family
        if family.kind != MetricKind.GAUGE:
            if family.kind == MetricKind.HISTOGRAM:
                raise _refused("Failed to increment metric value",
                               _unsupported(MetricKind.HISTOGRAM, "Increment"))
            if value < 0.0:
                raise _refused("Failed to increment metric value",
                               "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented "
                               "monotonically by non-negative values.")
        with family.lock:
            series.value += value
            series.updated = time.monotonic()
            _changed()

    def set(self, value):
        series = self._series
        if series is None:
            raise TritonModelException("Failed to set metric value: " + _CLEARED)
        value = _double(value)
        family = self._family
        if family.kind != MetricKind.GAUGE:
            raise _refused("Failed to set metric value", _unsupported(family.kind, "Set"))
        with family.lock:
            series.value = value
            series.updated = time.monotonic()
            _changed()

    def observe(self, value):
        series = self._series
        if series is None:
            raise TritonModelException("Failed to observe metric value: " + _CLEARED)
        value = _double(value)
        family = self._family
        if family.kind != MetricKind.HISTOGRAM:
            raise _refused("Failed to observe metric value", _unsupported(family.kind, "Observe"))
        with family.lock:
            series.counts[bisect.bisect_left(series.bounds, value)] += 1  # bounds are "le"
            series.count += 1
            series.value += value
            series.updated = time.monotonic()
            _changed()

    def value(self):
        series = self._series
        if series is None:
            raise TritonModelException("Failed to get metric value: " + _CLEARED)
        if self._family.kind == MetricKind.HISTOGRAM:
            raise _refused("Failed to get metric value",
                           _unsupported(MetricKind.HISTOGRAM, "Value"))
        return series.value


class MetricFamily:
    """A family of labelled series. Declaring a name again gives the same family (its first
    description stays); with another kind it is refused, server-wide as in Triton. Deleting
    this object clears the Metrics made through it, and a series goes with the last of them."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name, description, kind):
        if not isinstance(name, str) or not isinstance(description, str):
            raise TypeError("MetricFamily(): name and description must be str")
        try:
            kind = MetricKind(kind)
        except ValueError:
            raise TypeError(f"MetricFamily(): unknown metric kind {kind!r}") from None
        with _registry_lock:
            family = _registry.get(name)
            if family is None:
                _declare_family(name, description, kind)
                family = _registry[name] = _Family(name, description, kind)
        if family.kind != kind:
            raise _refused("Error when creating MetricFamily",
                           "Family name already exists with different type")
        self._family = family
        self._metrics: dict = {}  # sorted label items -> the Metric made through this object

    def Metric(self, labels=None, buckets=None):  # noqa: N802 (Triton's name)
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        family = self._family
        bounds = None
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if family.kind != MetricKind.HISTOGRAM:
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
            bounds = [_double(b) for b in buckets]
        elif family.kind == MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        labels = dict(labels or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise TritonModelException("Metric labels must map str to str")
        key = tuple(sorted(labels.items()))
        metric = self._metrics.get(key)
        if metric is not None:  # same labels, same series: Triton's Metric objects share it
            return metric
        with family.lock:
            series = family.series.get(key)
            if series is None:
                # Triton checks the bounds of a new series only; an existing one keeps its own.
                if any(a >= b for a, b in zip(bounds or (), (bounds or ())[1:])):
                    raise _refused("Error when creating Metric",
                                   "Bucket Boundaries must be strictly sorted")
                series = family.series[key] = _Series(labels, bounds)
                _changed()  # a new series shows, at 0
            series.users += 1
            metric = self._metrics[key] = Metric(family, series)
        return metric

    def __del__(self):
        metrics = getattr(self, "_metrics", None)
        if not metrics:
            return
        family = self._family
        with family.lock:
            for key, metric in metrics.items():
                series, metric._series = metric._series, None
                series.users -= 1
                if not series.users and family.series.get(key) is series:
                    del family.series[key]
            _changed()


def _declare_family(name: str, description: str, kind: MetricKind) -> None:
    """Tell the front, which keeps the server's family names: another model's family of that
    name and another kind refuses this one. Outside a worker this process is the registry."""
    if CONTEXT.server_calls is None:
        return
    try:
        _control("metric_family", {"name": name, "description": description, "kind": int(kind)})
    except TritonModelException as exc:
        raise _refused("Error when creating MetricFamily", str(exc)) from None
