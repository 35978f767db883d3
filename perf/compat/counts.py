"""What a case added to every model's counts: its statistics (without the times) and the request
counters of the metrics endpoint, read once two readings in a row agree, and the difference
before and after a case ("counted <case>")."""
import re
import time
import urllib.request

from .calls import http_call


def counts_of(stats: dict) -> dict:
    """A model's statistics without the times (durations, last_inference, memory), flat."""
    counts = {"inference_count": stats["inference_count"], "execution_count": stats["execution_count"]}
    counts.update({key: value["count"] for key, value in stats["inference_stats"].items()})
    counts.update({f"batch {b['batch_size']}": b["compute_infer"]["count"] for b in stats["batch_stats"]})
    for key, value in stats.get("response_stats", {}).items():
        counts.update({f"response {key} {k}": v["count"] for k, v in value.items()})
    return counts


# The counters of the metrics endpoint that count requests, by model.
COUNTED_METRICS = re.compile(r'^(nv_inference_request_success|nv_inference_request_failure|nv_inference_count|'
                             r'nv_inference_exec_count)\{(.*)\} (\S+)$', re.M)


def metric_counts(metrics_port) -> dict:
    """{model: {counter (with its reason): value}}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30).read().decode()
    counts = {}
    for name, labels, value in COUNTED_METRICS.findall(text):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        key = f"metric {name}" + (f" {labels['reason']}" if "reason" in labels else "")
        counts.setdefault(labels["model"], {})[key] = float(value)
    return counts


def all_counts(ports, settle_s: float = 0.0) -> dict:
    """Every model's counts, in its statistics and its metrics, after `settle_s` and once two
    readings in a row agree (a server may count a request a moment after it answered it:
    Triton a decoupled one, when it releases it)."""
    http_port, _, metrics_port = ports
    time.sleep(settle_s)
    last = None
    for _ in range(20):
        answer = http_call(http_port, "GET", "/v2/models/stats")
        counts = {e["name"]: counts_of(e) for e in answer[1]["model_stats"]} if answer[0] == 200 else {}
        for model, metrics in metric_counts(metrics_port).items():
            counts.setdefault(model, {}).update(metrics)
        if counts == last:
            return counts
        last = counts
        time.sleep(0.005)
    return last


def counted(before: dict, after: dict) -> dict:
    """What one case added to each model's counts, the models it left alone left out."""
    added = {}
    for model, counts in after.items():
        earlier = before.get(model, {})
        delta = {key: value - earlier.get(key, 0) for key, value in counts.items()
                 if value != earlier.get(key, 0)}
        if delta:
            added[model] = delta
    return added
