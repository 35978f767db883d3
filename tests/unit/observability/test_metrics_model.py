"""The per-model metrics collector, read at scrape time from ModelStats' integers: the request
duration and batch size histograms, Triton's counters with their names and failure reasons,
metric tags, cache counters, the counters' headers, the metrics config's switches, the first
response histogram and its buckets, and the latency summaries of the last minute."""

import math
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from shmserve.config.parse import parse_config_text
from shmserve.observability.metrics import BATCH_SIZE_BOUNDS, ModelMetricsCollector, exposition
from shmserve.observability.stats import (REQUEST_DURATION_BOUNDS_NS, ModelStats,
                                          first_response_bounds_ms)
from shmserve.observability.summaries import SAMPLES_PER_BUCKET, LatencySummaries
from tests.unit.observability.metrics_helpers import LABELS, MS, FakeRegistry, model, scrape


def succeed(stats, request_ns, batch_size=1):
    stats.record_success(batch_size=batch_size, request_ns=request_ns, queue_ns=0,
                         compute_input_ns=0, compute_infer_ns=0, compute_output_ns=0)


def execute(stats, batch_size):
    stats.record_execution(batch_size, SimpleNamespace(compute_input_ns=1, compute_infer_ns=2,
                                                       compute_output_ns=3, gpu_uuid=""))


def bucket(name, le):
    return (name + "_bucket", tuple(sorted(LABELS + (("le", le),))))


def test_request_duration_histogram_counts_successes_and_failures():
    stats = ModelStats()
    succeed(stats, 50_000)          # 50 us: first bucket
    succeed(stats, 100_000)         # exactly on the first bound: still the first bucket (le)
    succeed(stats, 3 * MS)          # 3 ms: the 5 ms bucket
    stats.record_failure(700 * MS, "BACKEND")
    stats.record_failure(120_000 * MS, "OTHER")  # 2 min: past the last bound
    out = scrape(ModelMetricsCollector(FakeRegistry(model(stats=stats))))
    name = "shmserve_inference_request_duration_seconds"
    assert out[bucket(name, "0.0001")] == 2
    assert out[bucket(name, "0.0025")] == 2
    assert out[bucket(name, "0.005")] == 3
    assert out[bucket(name, "1.0")] == 4
    assert out[bucket(name, "60.0")] == 4
    assert out[bucket(name, "+Inf")] == 5
    assert out[(name + "_count", LABELS)] == 5
    assert out[(name + "_sum", LABELS)] == pytest.approx((150_000 + 3 * MS + 120_700 * MS) / 1e9)
    les = [le for (n, labels) in out if n == name + "_bucket"
           for k, le in labels if k == "le"]
    assert len(les) == len(REQUEST_DURATION_BOUNDS_NS) + 1


def test_batch_size_histogram_from_executions():
    stats = ModelStats()
    for size in (1, 1, 3, 8, 2000):
        execute(stats, size)
    out = scrape(ModelMetricsCollector(FakeRegistry(model(stats=stats))))
    name = "shmserve_inference_batch_size"
    assert out[bucket(name, "1")] == 2
    assert out[bucket(name, "2")] == 2
    assert out[bucket(name, "4")] == 3
    assert out[bucket(name, "8")] == 4
    assert out[bucket(name, str(BATCH_SIZE_BOUNDS[-1]))] == 4
    assert out[bucket(name, "+Inf")] == 5
    assert out[(name + "_sum", LABELS)] == 2013
    assert out[("nv_inference_exec_count", LABELS)] == 5


def test_triton_counters_keep_their_names_and_reasons():
    stats = ModelStats()
    succeed(stats, 2 * MS, batch_size=4)
    stats.record_failure(1 * MS, "REJECTED")
    out = scrape(ModelMetricsCollector(FakeRegistry(model(stats=stats))))
    assert out[("nv_inference_request_success", LABELS)] == 1
    assert out[("nv_inference_count", LABELS)] == 4
    assert out[("nv_inference_request_duration_us", LABELS)] == 3000
    assert out[("nv_model_load_duration_secs", LABELS)] == 0.25
    failures = {dict(labels)["reason"]: v for (n, labels), v in out.items()
                if n == "nv_inference_request_failure"}
    assert failures == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}


def test_metric_tags_label_every_series_of_their_model():
    stats = ModelStats()
    succeed(stats, 2 * MS)
    execute(stats, 1)
    tagged = model("t", stats=stats, cache=True, tags={"team": "search", "tier": "gold"})
    out = scrape(ModelMetricsCollector(FakeRegistry(tagged, model("plain"))))
    key = (("_team", "search"), ("_tier", "gold"), ("model", "t"), ("version", "1"))
    assert out[("nv_inference_request_success", key)] == 1
    assert out[("nv_inference_exec_count", key)] == 1
    assert out[("nv_cache_num_hits_per_model", key)] == 0
    assert out[("shmserve_inference_batch_size_count", key)] == 1
    assert out[("nv_inference_request_failure", tuple(sorted(key + (("reason", "OTHER"),))))] == 0
    assert out[("nv_inference_request_success", (("model", "plain"), ("version", "1")))] == 0
    series = [labels for (name, labels) in out if dict(labels).get("model") == "t"]
    assert series and all(dict(labels)["_team"] == "search" for labels in series)


def test_cache_counters_show_only_for_models_that_enable_the_cache():
    cached = model("c", cache=True)
    cached.stats.cache_hit.add(3_000, 2)
    cached.stats.cache_miss.add(5_000, 1)
    samples = scrape(ModelMetricsCollector(FakeRegistry(cached, model("plain"))))
    key = (("model", "c"), ("version", "1"))
    assert samples[("nv_cache_num_hits_per_model", key)] == 2
    assert samples[("nv_cache_num_misses_per_model", key)] == 1
    assert samples[("nv_cache_hit_duration_per_model", key)] == 3
    assert samples[("nv_cache_miss_duration_per_model", key)] == 5
    assert ("nv_cache_num_hits_per_model", (("model", "plain"), ("version", "1"))) not in samples
    samples = scrape(ModelMetricsCollector(FakeRegistry(model("plain"))))
    assert not any(name.startswith("nv_cache_") for name, _ in samples)


def test_counter_headers_name_the_counter_as_its_samples_do():
    stats = ModelStats()
    succeed(stats, 1000)
    prom = CollectorRegistry(auto_describe=False)
    prom.register(ModelMetricsCollector(FakeRegistry(model(stats=stats))))
    text = exposition(prom).decode()
    assert "# TYPE nv_inference_request_success counter\n" in text
    assert "# HELP nv_inference_request_success Number of successful" in text
    assert "_total" not in text
    assert text == exposition(prom).decode()  # nothing else changes between scrapes


def test_metrics_config_switches_the_latency_counters_and_the_first_response_histogram():
    stats = ModelStats()
    succeed(stats, 1000)
    stats.record_first_response(150 * MS)
    stats.record_first_response(6000 * MS)
    default = scrape(ModelMetricsCollector(FakeRegistry(model(stats=stats))))
    assert any(n == "nv_inference_request_duration_us" for n, _ in default)
    assert not any(n.startswith("nv_inference_first_response") for n, _ in default)
    switched = scrape(ModelMetricsCollector(FakeRegistry(model(stats=stats, decoupled=True)),
                                            counter_latencies=False, histogram_latencies=True))
    assert not any(n.endswith("_duration_us") for n, _ in switched)
    buckets = {dict(labels)["le"]: v for (n, labels), v in switched.items()
               if n == "nv_inference_first_response_histogram_ms_bucket"}
    assert buckets == {"100": 0, "500": 1, "2000": 1, "5000": 1, "+Inf": 2}
    key = (("model", "m"), ("version", "1"))
    assert switched[("nv_inference_first_response_histogram_ms_sum", key)] == 6150
    assert switched[("nv_inference_first_response_histogram_ms_count", key)] == 2


def test_every_model_has_a_first_response_histogram():
    """As in Triton since 2.65 (2.51 created it for decoupled models only)."""
    versions = FakeRegistry(model("plain"), model("stream", decoupled=True))
    out = scrape(ModelMetricsCollector(versions, histogram_latencies=True))
    models = {dict(labels)["model"] for n, labels in out
              if n == "nv_inference_first_response_histogram_ms_count"}
    assert models == {"plain", "stream"}


def test_model_metrics_set_the_first_response_buckets():
    config = parse_config_text('''
        backend: "python"
        model_metrics { metric_control [
          { metric_identifier { family: "nv_inference_first_response_histogram_ms" }
            histogram_options { buckets: [ 1, 0.5, 50 ] } },
          { metric_identifier { family: "some_other_family" }
            histogram_options { buckets: [ 7 ] } } ] }''')
    assert first_response_bounds_ms(config) == (0.5, 1.0, 50.0)
    default = first_response_bounds_ms(parse_config_text('backend: "python"'))
    assert default == (100, 500, 2000, 5000)
    stats = ModelStats(first_response_bounds_ms=first_response_bounds_ms(config))
    for ms in (0.2, 0.5, 3, 3, 80):
        stats.record_first_response(int(ms * MS))
    out = scrape(ModelMetricsCollector(FakeRegistry(model(stats=stats, decoupled=True)),
                                       histogram_latencies=True))
    buckets = {dict(labels)["le"]: v for (n, labels), v in out.items()
               if n == "nv_inference_first_response_histogram_ms_bucket"}
    assert buckets == {"0.5": 2, "1": 2, "50": 4, "+Inf": 5}


def test_latency_summaries_read_quantiles_of_the_last_minute():
    now = [0.0]
    stats = ModelStats(summaries=LatencySummaries(((0.5, 0.05), (0.99, 0.001)),
                                                  clock=lambda: now[0]))
    for ms in range(1, 101):
        stats.record_success(batch_size=1, request_ns=ms * MS, queue_ns=2 * ms * MS,
                             compute_input_ns=0, compute_infer_ns=ms * MS, compute_output_ns=0)
    stats.record_cache_hit(request_ns=50 * MS, lookup_ns=MS)
    samples = scrape(ModelMetricsCollector(FakeRegistry(model(stats=stats))))
    key = (("model", "m"), ("version", "1"))

    def quantile(kind, q):
        return samples[(f"nv_inference_{kind}_summary_us", (*key[:1], ("quantile", q), *key[1:]))]

    assert quantile("request", "0.5") == 50_000 and quantile("request", "0.99") == 99_000
    assert quantile("queue", "0.5") == 100_000
    assert samples[("nv_inference_request_summary_us_count", key)] == 101  # the cached one too
    assert samples[("nv_inference_queue_summary_us_count", key)] == 100
    assert samples[("nv_inference_compute_infer_summary_us_sum", key)] == 5050 * 1000
    # A minute later the window is empty: NaN quantiles, cumulative count and sum.
    now[0] = 61.0
    later = scrape(ModelMetricsCollector(FakeRegistry(model(stats=stats))))
    assert later[("nv_inference_request_summary_us_count", key)] == 101
    assert math.isnan(later[("nv_inference_request_summary_us",
                             (("model", "m"), ("quantile", "0.5"), ("version", "1")))])
    # Without summary_latencies there are none.
    assert not any("summary" in n for n, _ in scrape(
        ModelMetricsCollector(FakeRegistry(model(stats=ModelStats())))))


def test_summaries_keep_a_bounded_sample_of_a_busy_minute():
    now = [0.0]
    summaries = LatencySummaries(clock=lambda: now[0])
    for i in range(50_000):
        summaries.observe(i * 1000, 0, 0, 0, 0)  # 0 .. 49,999 us, uniform
    count, total, quantiles = summaries.read("request")
    assert count == 50_000 and total == sum(range(50_000))
    assert len(summaries.windows["request"]._buckets[-1].samples) == SAMPLES_PER_BUCKET
    for q, got in quantiles:
        assert abs(got / 50_000 - q) < 0.04, (q, got)
    # Older age buckets leave the window one by one: the newest observations decide.
    now[0] = 13.0
    for _ in range(1000):
        summaries.observe(10 ** 9, 0, 0, 0, 0)  # 1,000,000 us
    assert dict(summaries.read("request")[2])[0.999] == 1_000_000
    now[0] = 62.0
    assert dict(summaries.read("request")[2])[0.5] == 1_000_000
