"""The rate limiter end to end: two models of two instances each share a resource R that each
instance needs one copy of; batch_parallel's model reports when each execution ran."""

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import ROOT, start_server, stop_server

MODELS = ("rl_a", "rl_b")
CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 4
input [
  {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "DELAY" data_type: TYPE_FP32 dims: [ 1 ] optional: true }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "REQUESTS" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "INSTANCE" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "START" data_type: TYPE_FP64 dims: [ 1 ] }},
  {{ name: "END" data_type: TYPE_FP64 dims: [ 1 ] }}
]
instance_group [ {{ count: 2 kind: KIND_CPU
                   rate_limiter {{ resources [ {{ name: "R" count: 1 }} ] priority: 1 }} }} ]
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("rate_limited")
    for name in MODELS:
        (repo / name).mkdir()
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name))
        os.symlink(os.path.join(ROOT, "tests", "models", "batch_parallel", "1"), repo / name / "1")
    return str(repo)


def executions(server, requests: int) -> list:
    """(start, end) of each execution, `requests` sent at once, alternating the two models."""
    def one(k):
        with httpclient.InferenceServerClient(server.http_url) as client:
            inputs = [httpclient.InferInput("INPUT0", [1, 1], "FP32"),
                      httpclient.InferInput("DELAY", [1, 1], "FP32")]
            inputs[0].set_data_from_numpy(np.array([[k]], np.float32))
            inputs[1].set_data_from_numpy(np.array([[0.15]], np.float32))
            result = client.infer(MODELS[k % 2], inputs)
            return float(result.as_numpy("START")[0, 0]), float(result.as_numpy("END")[0, 0])

    with ThreadPoolExecutor(requests) as pool:
        return sorted(set(pool.map(one, range(requests))))


def most_at_once(intervals: list) -> int:
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
                   key=lambda e: (e[0], e[1]))
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


@pytest.mark.parametrize("flags,expected", [
    # One copy of R (the most any instance asks for): one execution at a time, of all four
    # instances of both models.
    (["--rate-limit=execution_count"], 1),
    (["--rate-limit=execution_count", "--rate-limit-resource=R:2"], 2),
    # Without the limiter the resources are ignored: all four instances run.
    ([], 4),
])
def test_executions_never_exceed_the_resource(repository, tmp_path, flags, expected):
    server = start_server(repository, str(tmp_path / "s.log"), *flags, wait_models=MODELS)
    try:
        assert most_at_once(executions(server, 8)) == expected
    finally:
        stop_server(server)
