"""The response cache (--cache-config local,size=N, `response_cache { enable: true }`),
through the test model cache_probe, whose RUN output tells an executed answer from a cached
one, over both protocols; statistics and metrics count hits and misses."""

import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import start_server, stop_server, wait_for_models


@pytest.fixture(scope="module")
def cached(test_repository, tmp_path_factory):
    server = start_server(test_repository, str(tmp_path_factory.mktemp("logs") / "s.log"),
                          "--model-control-mode=explicit", "--load-model=cache_probe",
                          "--cache-config=local,size=1048576", wait_models=("cache_probe",))
    yield server
    stop_server(server)


def infer(client, module, values, outputs=None):
    tensor = module.InferInput("INPUT0", [len(values)], "FP32")
    tensor.set_data_from_numpy(np.array(values, np.float32))
    requested = None if outputs is None else [module.InferRequestedOutput(o) for o in outputs]
    return client.infer("cache_probe", [tensor], outputs=requested)


def test_the_same_request_is_answered_from_the_cache(cached):
    http = httpclient.InferenceServerClient(cached.http_url)
    with grpcclient.InferenceServerClient(cached.grpc_url) as grpc:
        first = infer(http, httpclient, [1.0, 2.0])
        again = infer(grpc, grpcclient, [1.0, 2.0])  # same request, other protocol
        other = infer(http, httpclient, [1.0, 3.0])
        subset = infer(http, httpclient, [1.0, 2.0], outputs=["OUTPUT0"])
        assert first.as_numpy("RUN").tolist() == again.as_numpy("RUN").tolist() == [1]
        assert again.as_numpy("OUTPUT0").tolist() == [1.0, 2.0]
        assert other.as_numpy("RUN").tolist() == [2]  # other data: executed
        assert subset.as_numpy("RUN") is None and subset.as_numpy("OUTPUT0").tolist() == [1.0, 2.0]
        stats = grpc.get_inference_statistics("cache_probe", as_json=True)["model_stats"][0]
        # The same outputs asked as a classification are another answer, cached apart.
        tensor = httpclient.InferInput("INPUT0", [2], "FP32")
        tensor.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
        top = http.infer("cache_probe", [tensor], outputs=[
            httpclient.InferRequestedOutput("OUTPUT0", class_count=1)]).as_numpy("OUTPUT0")
        assert top.tolist() == [b"2.000000:1"]
    http.close()
    inference = stats["inference_stats"]
    assert int(inference["cache_hit"]["count"]) == 1
    assert int(inference["cache_miss"]["count"]) == 3
    assert int(inference["success"]["count"]) == 4
    assert int(stats["inference_count"]) == 3 and int(stats["execution_count"]) == 3
    with urllib.request.urlopen(f"http://127.0.0.1:{cached.metrics_port}/metrics") as r:
        text = r.read().decode()
    assert 'nv_cache_num_hits_per_model{model="cache_probe",version="1"} 1.0' in text
    assert 'nv_cache_num_misses_per_model{model="cache_probe",version="1"} 4.0' in text  # + the classification


def test_without_a_server_cache_the_model_runs_every_time(server, clients):
    wait_for_models(server, ["cache_probe"])
    runs = [infer(clients["http"], httpclient, [7.0]).as_numpy("RUN")[0] for _ in range(2)]
    assert runs[1] == runs[0] + 1
