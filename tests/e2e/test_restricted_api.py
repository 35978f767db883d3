"""--http-restricted-api and --grpc-restricted-protocol: restricted categories answer 403
(HTTP) or UNAVAILABLE (gRPC) without their header, and as usual with it; the others are
untouched."""

import json
import queue
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server, stop_server

KEY = {"admin-key": "s3cret"}


@pytest.fixture(scope="module")
def restricted(test_repository, tmp_path_factory):
    server = start_server(test_repository, str(tmp_path_factory.mktemp("logs") / "s.log"),
                          "--model-control-mode=explicit", "--load-model=add_sub",
                          "--load-model=repeat",
                          "--http-restricted-api=model-repository,logging:admin-key=s3cret",
                          "--grpc-restricted-protocol=inference,statistics:admin-key=s3cret",
                          wait_models=("add_sub", "repeat"))
    yield server
    stop_server(server)


def http(server, method, path, headers=None, body=None) -> tuple:
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=body,
                                     method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_http_restricted_categories_need_the_header(restricted):
    status, body = http(restricted, "GET", "/v2/logging")
    assert status == 403
    assert json.loads(body) == {"error": "This API is restricted, expecting header 'admin-key'"}
    status, body = http(restricted, "POST", "/v2/repository/index", body=b"{}")
    assert status == 403
    assert http(restricted, "GET", "/v2/logging", KEY)[0] == 200
    assert http(restricted, "POST", "/v2/repository/index", KEY, b"{}")[0] == 200
    # Other categories need nothing.
    assert http(restricted, "GET", "/v2/health/ready")[0] == 200
    assert http(restricted, "GET", "/v2/models/add_sub/config")[0] == 200


def add_sub_inputs():
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        t = grpcclient.InferInput(name, [4], "FP32")
        t.set_data_from_numpy(np.ones(4, np.float32))
        inputs.append(t)
    return inputs


def test_grpc_restricted_categories_need_the_metadata(restricted):
    with grpcclient.InferenceServerClient(restricted.grpc_url) as client:
        with pytest.raises(InferenceServerException) as e:
            client.infer("add_sub", add_sub_inputs())
        assert e.value.status() == "StatusCode.UNAVAILABLE"
        assert e.value.message() == "This API is restricted, expecting header 'admin-key'"
        with pytest.raises(InferenceServerException):
            client.get_inference_statistics("add_sub")
        result = client.infer("add_sub", add_sub_inputs(), headers=KEY)
        assert result.as_numpy("OUTPUT0").tolist() == [2.0] * 4
        assert client.get_inference_statistics("add_sub", headers=KEY).model_stats
        assert client.is_server_ready()  # health is not restricted
        # A stream is refused as a whole, as soon as it opens.
        errors = queue.Queue()
        client.start_stream(callback=lambda result, error: errors.put(error))
        try:
            error = errors.get(timeout=10)
        finally:
            client.stop_stream()
        assert "This API is restricted, expecting header 'admin-key'" in str(error)
