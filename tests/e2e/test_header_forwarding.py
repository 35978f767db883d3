"""--http-header-forward-pattern and --grpc-header-forward-pattern: matching headers reach
the model as request parameters (params_echo answers with request.parameters())."""

import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server, stop_server

HEADERS = {"X-Tag": "abc", "Other": "no", "x-mine": "kept-param"}


@pytest.fixture(scope="module")
def forwarding(test_repository, tmp_path_factory):
    server = start_server(test_repository, str(tmp_path_factory.mktemp("logs") / "s.log"),
                          "--model-control-mode=explicit", "--load-model=params_echo",
                          "--http-header-forward-pattern=^(x-|priority)",
                          "--grpc-header-forward-pattern=^(x-|triton_)",
                          wait_models=("params_echo",))
    yield server
    stop_server(server)


def tensor(module):
    t = module.InferInput("INPUT0", [1], "INT32")
    t.set_data_from_numpy(np.array([1], np.int32))
    return t


def params_of(result) -> dict:
    return json.loads(result.as_numpy("PARAMS")[0])


def test_http_headers_that_match_become_parameters(forwarding):
    with httpclient.InferenceServerClient(forwarding.http_url) as client:
        result = client.infer("params_echo", [tensor(httpclient)], headers=HEADERS,
                              parameters={"x-mine": "from-request"})
    # Names are lower case; the request's own parameter wins.
    assert params_of(result) == {"x-tag": "abc", "x-mine": "from-request"}


@pytest.mark.parametrize("protocol, name", [("http", "Priority"), ("grpc", "triton_x")])
def test_a_header_that_would_set_a_parameter_the_server_acts_on_fails_the_request(
        forwarding, protocol, name):
    """As Triton since 2.69: INVALID_ARG, rather than a header changing how the request is
    scheduled."""
    module = httpclient if protocol == "http" else grpcclient
    url = forwarding.http_url if protocol == "http" else forwarding.grpc_url
    with module.InferenceServerClient(url) as client:
        with pytest.raises(InferenceServerException) as e:
            client.infer("params_echo", [tensor(module)], headers={name: "7"})
    assert e.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    assert e.value.message() == (f"Header '{name.lower()}' is reserved for Triton usage and "
                                 f"cannot be forwarded.")


def test_grpc_metadata_that_matches_becomes_parameters_also_on_streams(forwarding):
    metadata = {"x-tag": "def", "other": "no"}
    with grpcclient.InferenceServerClient(forwarding.grpc_url) as client:
        result = client.infer("params_echo", [tensor(grpcclient)], headers=metadata)
        assert params_of(result) == {"x-tag": "def"}
        answers = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=metadata)
        client.async_stream_infer("params_echo", [tensor(grpcclient)])
        streamed, error = answers.get(timeout=10)
        client.stop_stream()
    assert error is None and params_of(streamed) == {"x-tag": "def"}


def test_without_a_pattern_nothing_is_forwarded(clients):
    result = clients["http"].infer("params_echo", [tensor(httpclient)], headers=HEADERS)
    assert params_of(result) == {}
