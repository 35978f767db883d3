"""The metrics endpoint of a real server: values move as requests succeed and fail, and every
metric the Grafana dashboard and the autoscaler's adapter rule query is one the server exports."""

import json
import os
import re
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, metric_samples, start_server, stop_server, wait_for_models

# Triton's GPU families (reference section 6): absent where the server sees no GPU.
GPU_METRICS = {"nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes",
               "nv_gpu_power_usage", "nv_gpu_power_limit", "nv_energy_consumption"}


def scrape(server) -> dict:
    """{(sample name, sorted labels): value} of the server's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                timeout=5) as r:
        text = r.read().decode()
    return metric_samples(text)


def value(samples, name, model, **labels):
    key = tuple(sorted(dict(labels, model=model, version="1").items()))
    return samples[(name, key)]


@pytest.fixture(scope="module")
def http(server):
    wait_for_models(server, ["identity_batch", "raiser", "error_response"])
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.close()


def fp32(name, array):
    tensor = httpclient.InferInput(name, list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return tensor


def test_values_move_as_requests_are_served(server, http):
    before = scrape(server)
    for _ in range(3):  # batch size 3: the model's default scheduler runs each one alone
        http.infer("identity_batch", [fp32("INPUT0", np.ones((3, 4), np.float32))])
    wrong_type = httpclient.InferInput("INPUT0", [1, 4], "INT32")
    wrong_type.set_data_from_numpy(np.ones((1, 4), np.int32))
    with pytest.raises(InferenceServerException):
        http.infer("identity_batch", [wrong_type])
    with pytest.raises(InferenceServerException, match="raiser always fails"):
        http.infer("raiser", [fp32("INPUT0", np.ones(4, np.float32))])
    with pytest.raises(InferenceServerException, match="bad thing"):
        http.infer("error_response", [fp32("INPUT0", np.ones(4, np.float32))])
    after = scrape(server)

    def delta(name, model, **labels):
        return value(after, name, model, **labels) - value(before, name, model, **labels)

    m = "identity_batch"
    assert delta("nv_inference_request_success", m) == 3
    assert delta("nv_inference_count", m) == 9
    assert delta("nv_inference_exec_count", m) == 3
    # A request the model's validation refuses never reaches the scheduler: Triton counts it
    # nowhere, neither as a failure nor in any duration.
    for reason in ("REJECTED", "OTHER"):
        assert delta("nv_inference_request_failure", m, reason=reason) == 0
    assert delta("nv_inference_request_failure", m, reason="BACKEND") == 0
    assert delta("nv_inference_request_failure", "raiser", reason="BACKEND") == 1
    assert delta("nv_inference_request_success", "raiser") == 0
    # A model that answers with an error ran well: Triton counts the request a success.
    assert delta("nv_inference_request_success", "error_response") == 1
    assert delta("nv_inference_count", "error_response") == 1
    assert delta("nv_inference_request_failure", "error_response", reason="BACKEND") == 0
    for name in ("nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                 "nv_inference_compute_infer_duration_us"):
        assert delta(name, m) > 0, name
    assert value(after, "nv_inference_pending_request_count", m) == 0
    assert value(after, "nv_model_load_duration_secs", m) > 0

    latency = "shmserve_inference_request_duration_seconds"
    assert delta(latency + "_count", m) == 3
    assert delta(latency + "_bucket", m, le="+Inf") == 3
    assert delta(latency + "_sum", m) > 0
    assert delta(latency + "_count", "raiser") == 1
    batch = "shmserve_inference_batch_size"
    assert delta(batch + "_bucket", m, le="2") == 0
    assert delta(batch + "_bucket", m, le="4") == 3
    assert delta(batch + "_count", m) == 3 and delta(batch + "_sum", m) == 9


# PromQL words that are not metric names where an identifier stands alone.
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                   "and", "or", "unless", "offset"}


def metric_names(expr: str) -> set:
    """The metric names a PromQL expression (or a prometheus-adapter template) reads."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', "", expr)  # strings
    expr = re.sub(r"<<[^>]*>>", "", expr)  # adapter templates
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)  # label matchers, ranges
    expr = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # grouping labels
    expr = re.sub(r"\b\d+(?:\.\d+)?(?:[eE][+-]?\d+)?\b", "", expr)  # numbers
    return {m.group() for m in re.finditer(r"[A-Za-z_:][\w:]*", expr)
            if m.group() not in PROMQL_KEYWORDS and not expr[m.end():].lstrip().startswith("(")}


def dashboard_exprs() -> list:
    with open(os.path.join(ROOT, "deploy", "grafana", "shmserve-dashboard.json")) as f:
        dashboard = json.load(f)
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def adapter_queries() -> list:
    with open(os.path.join(ROOT, "deploy", "kubernetes", "prometheus-adapter-rules.yaml")) as f:
        config = yaml.safe_load(yaml.safe_load(f)["data"]["config.yaml"])
    return [rule["seriesQuery"] for rule in config["rules"]]


def test_metric_names_extracted_from_promql():
    assert metric_names('histogram_quantile(0.99, sum by (model, le) (rate('
                        'x_bucket{model=~"$m"}[$__rate_interval]))) / 1e6 + on (pod) y') \
        == {"x_bucket", "y"}


def test_dashboard_and_autoscaler_use_exported_metrics(server, http):
    exported = {name for name, _ in scrape(server)}
    used = set().union(*map(metric_names, dashboard_exprs() + adapter_queries()))
    assert {"nv_inference_request_success", "shmserve_inference_request_duration_seconds_bucket",
            "nv_inference_pending_request_count"} <= used
    assert used - exported <= GPU_METRICS


def test_a_models_custom_metrics_show_on_the_endpoint_summed_over_its_instances(server, http):
    """metrics_probe (2 instances) counts each request, sets a gauge and observes a histogram
    (pb_utils.MetricFamily); the next scrape shows them all."""
    wait_for_models(server, ["metrics_probe"])
    values = [0.5, 2.0, 20.0, 4.0]
    for v in values:
        tensor = fp32("VALUE", np.array([v], np.float32))
        http.infer("metrics_probe", [tensor])
    labels = (("model", "metrics_probe"),)
    samples = scrape(server)
    assert samples[("probe_requests", labels)] == len(values)
    assert samples[("probe_last_value", labels)] == 4.0
    buckets = {dict(key)["le"]: v for (name, key), v in samples.items()
               if name == "probe_values_bucket"}
    assert buckets == {"1": 1, "10": 3, "+Inf": 4}  # Triton's `le` texts
    assert samples[("probe_values_count", labels)] == 4
    assert samples[("probe_values_sum", labels)] == sum(values)


def scrape_text(http, value: float, parameters: dict) -> str:
    result = http.infer("metrics_scrape", [fp32("VALUE", np.array([value], np.float32))],
                        parameters=parameters)
    return result.as_numpy("TEXT")[0].decode()


def test_a_value_set_in_execute_shows_in_a_scrape_from_that_execute(server, http):
    """metrics_scrape sets its metrics, then reads /metrics from inside execute() (as Triton's
    QA model custom_metrics does): the scrape waits on the worker for fresh values while that
    worker's execute() waits on the scrape, and shows them."""
    wait_for_models(server, ["metrics_scrape"])
    labels = (("model", "metrics_scrape"),)
    for n, v in enumerate([3.0, 20.0, 0.5], start=1):
        samples = metric_samples(scrape_text(http, v, {"mode": "scrape",
                                                       "metrics_port": server.metrics_port}))
        assert samples[("scrape_value", labels)] == v
        assert samples[("scrape_requests", labels)] == n
        assert samples[("scrape_values_count", labels)] == n
    buckets = {dict(key)["le"]: v for (name, key), v in samples.items()
               if name == "scrape_values_bucket"}
    assert buckets == {"1": 1, "10": 2, "+Inf": 3}


def test_a_family_name_keeps_its_kind_across_models(server, http):
    """As in Triton's registry, which the whole server shares: metrics_probe declared
    probe_requests a counter, so metrics_scrape cannot declare it a gauge."""
    wait_for_models(server, ["metrics_probe", "metrics_scrape"])
    assert scrape_text(http, 0.0, {"mode": "clash"}) == (
        "Error when creating MetricFamily: Failed to process the request for model "
        "'metrics_scrape_0_0', message: Family name already exists with different type")


def test_metrics_config_histogram_and_summary_latencies(test_repository, tmp_path):
    """With histogram_latencies=true every model's first responses are timed (Triton 2.51 kept
    that histogram for decoupled models only, 2.65 and later for all); with
    counter_latencies=false the duration counters go; summary_latencies gives the quantiles
    asked for."""
    server = start_server(test_repository, str(tmp_path / "s.log"),
                          "--model-control-mode=explicit", "--load-model=identity_batch",
                          "--load-model=repeat", "--metrics-config=histogram_latencies=true",
                          "--metrics-config=counter_latencies=false",
                          "--metrics-config=summary_latencies=true",
                          "--metrics-config=summary_quantiles=0.5:0.05,0.99:0.001",
                          wait_models=("identity_batch", "repeat"))
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            client.infer("identity_batch", [fp32("INPUT0", np.ones((1, 2), np.float32))])
        body = json.dumps({"IN": [1, 2, 3]}).encode()
        request = urllib.request.Request(
            f"http://{server.http_url}/v2/models/repeat/generate_stream", data=body,
            method="POST")
        with urllib.request.urlopen(request, timeout=10) as r:
            r.read()
        # A decoupled request is counted as it ends, just after its last response left.
        deadline = time.monotonic() + 10
        while True:
            samples = scrape(server)
            if value(samples, "nv_inference_request_summary_us_count", "repeat") == 1 \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        for model in ("repeat", "identity_batch"):
            assert value(samples, "nv_inference_first_response_histogram_ms_count", model) == 1
        assert not any(name.endswith("_duration_us") for name, _ in samples)
        for kind in ("request", "queue", "compute_input", "compute_infer", "compute_output"):
            name = f"nv_inference_{kind}_summary_us"
            assert value(samples, name + "_count", "identity_batch") == 1
            median = value(samples, name, "identity_batch", quantile="0.5")
            assert median == value(samples, name, "identity_batch", quantile="0.99")
            assert median == pytest.approx(value(samples, name + "_sum", "identity_batch"))
        request_us = value(samples, "nv_inference_request_summary_us", "repeat", quantile="0.5")
        assert 0 < request_us < 10_000_000
    finally:
        stop_server(server)


def test_metric_tags_become_labels_of_the_models_series(test_repository, tmp_path):
    """A config's metric_tags label each of that model's series `_<key>`, as in Triton; here
    the config comes with an explicit load."""
    server = start_server(test_repository, str(tmp_path / "s.log"),
                          "--model-control-mode=explicit")
    config = {"backend": "python", "max_batch_size": 8,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
              # On the CPU: a GPU instance's series would carry its GPU's UUID too.
              "instance_group": [{"kind": "KIND_CPU"}],
              "metric_tags": {"team": "search", "tier": "gold"}}
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            client.load_model("identity_batch", config=json.dumps(config))
            assert client.get_model_config("identity_batch")["metric_tags"] == {
                "team": "search", "tier": "gold"}
            client.infer("identity_batch", [fp32("INPUT0", np.ones((2, 3), np.float32))])
        tags = {"_team": "search", "_tier": "gold"}
        samples = scrape(server)
        assert value(samples, "nv_inference_request_success", "identity_batch", **tags) == 1
        assert value(samples, "nv_inference_count", "identity_batch", **tags) == 2
        assert value(samples, "nv_inference_request_failure", "identity_batch", reason="OTHER",
                     **tags) == 0
        untagged = [labels for name, labels in samples
                    if ("model", "identity_batch") in labels and ("_team", "search") not in labels]
        assert untagged == []
    finally:
        stop_server(server)
