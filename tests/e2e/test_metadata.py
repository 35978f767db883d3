"""Health, metadata, readiness and configuration, over HTTP and gRPC, through tritonclient."""

import json
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


@pytest.fixture(scope="module")
def http(server):
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def test_live(http, grpc):
    assert http.is_server_live()
    assert grpc.is_server_live()


def test_strict_readiness_reflects_the_model_that_failed(http, grpc):
    # bad_config cannot load, and --strict-readiness defaults to true, as in Triton.
    assert not http.is_server_ready()
    assert not grpc.is_server_ready()


def test_server_metadata(http, grpc):
    md = http.get_server_metadata()
    assert md["name"] == "shmserve"
    assert md["version"]
    assert "binary_tensor_data" in md["extensions"]
    gmd = grpc.get_server_metadata()
    assert gmd.name == "shmserve"
    assert list(gmd.extensions) == md["extensions"]


def test_model_metadata(http, grpc):
    md = http.get_model_metadata("add_sub")
    assert md == {
        "name": "add_sub", "versions": ["1"], "platform": "python",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4]},
                   {"name": "INPUT1", "datatype": "FP32", "shape": [4]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [4]},
                    {"name": "OUTPUT1", "datatype": "FP32", "shape": [4]}],
    }
    gmd = grpc.get_model_metadata("identity_fp32", as_json=True)
    assert gmd["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "-1"]}]
    assert http.get_model_metadata("identity_fp32", "1")["inputs"][0]["shape"] == [-1, -1]


def test_model_ready(http, grpc):
    assert http.is_model_ready("add_sub")
    assert http.is_model_ready("add_sub", "1")
    assert grpc.is_model_ready("add_sub")
    assert not http.is_model_ready("bad_config")
    assert not grpc.is_model_ready("bad_config")


@pytest.mark.parametrize("name, version", [("no_such_model", ""), ("add_sub", "7")])
def test_an_unknown_model_or_version_is_not_ready_rather_than_an_error(server, grpc, name,
                                                                      version):
    """As Triton: gRPC answers OK with ready false (tritonclient's is_model_ready would raise on
    an error), HTTP 400 "Model version not ready"."""
    assert grpc.is_model_ready(name, version) is False
    path = f"/v2/models/{name}" + (f"/versions/{version}" if version else "") + "/ready"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://{server.http_url}{path}", timeout=10)
    assert e.value.code == 400
    assert json.loads(e.value.read()) == {"error": "Model version not ready"}


def test_model_config_rendered_as_triton(server, http, grpc):
    cfg = http.get_model_config("identity_fp32")
    assert cfg["name"] == "identity_fp32"
    assert cfg["max_batch_size"] == 64
    assert cfg["input"][0]["dims"] == [-1]  # int64 as JSON numbers
    assert cfg["input"][0]["data_type"] == "TYPE_FP32"
    assert cfg["instance_group"][0]["kind"] == "KIND_CPU"
    # Real Triton 2.51 renders `dynamic_batching { }` with max_batch_size 64 exactly so.
    assert cfg["dynamic_batching"] == {
        "preferred_batch_size": [64], "max_queue_delay_microseconds": 0,
        "preserve_ordering": False, "priority_levels": 0, "default_priority_level": 0,
        "priority_queue_policy": {}}
    assert "sequence_batching" not in cfg
    raw = json.loads(urllib.request.urlopen(
        f"http://{server.http_url}/v2/models/add_sub/config").read())
    assert raw["backend"] == "python"
    assert "dynamic_batching" not in raw and "sequence_batching" not in raw
    gcfg = grpc.get_model_config("identity_fp32").config
    assert gcfg.max_batch_size == 64
    assert list(gcfg.input[0].dims) == [-1]


def test_unknown_model(http, grpc):
    with pytest.raises(InferenceServerException) as e:
        http.get_model_metadata("no_such_model")
    assert e.value.status() == "404"
    assert "Request for unknown model: 'no_such_model' is not found" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        grpc.get_model_metadata("no_such_model")
    assert e.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as e:
        http.get_model_config("add_sub", "7")
    assert e.value.status() == "404"


def test_repository_index_lists_the_failed_model(http, grpc):
    index = http.get_model_repository_index()
    bad = next(m for m in index if m["name"] == "bad_config")
    assert bad["state"] == "UNAVAILABLE"
    assert "config.pbtxt" in bad["reason"] or "line" in bad["reason"]
    assert {"name": "add_sub", "version": "1", "state": "READY"} in index
    names = {m.name for m in grpc.get_model_repository_index().models}
    assert {"add_sub", "bad_config"} <= names


def test_unknown_path_and_method(server):
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://{server.http_url}/v2/nothing")
    assert e.value.code == 404
    assert json.loads(e.value.read()) == {"error": "Not Found"}
    req = urllib.request.Request(f"http://{server.http_url}/v2/health/live", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 405


def test_metrics_endpoint(server, http):
    import numpy as np
    inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.ones((1, 4), np.float32))
    http.infer("identity_fp32", [inp])
    resp = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics")
    assert resp.headers["Content-Type"].startswith("text/plain")
    text = resp.read().decode()
    assert 'nv_inference_request_success{model="identity_fp32",version="1"}' in text
    assert 'nv_inference_count{model="identity_fp32",version="1"}' in text
    assert "nv_cpu_utilization" in text
