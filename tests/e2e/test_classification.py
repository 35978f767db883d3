"""The classification extension over HTTP and gRPC (tritonclient's class_count), through
the test model `classifier`: top-k as "<value>:<index>[:<label>]" per batch item."""


import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import wait_for_models

SCORES = np.array([[0.1, 0.7, 0.2, 0.05], [3.0, 1.0, 2.0, 4.0]], np.float32)


@pytest.fixture(scope="module", autouse=True)
def models_ready(server):
    wait_for_models(server, ["classifier"])


def classify(clients, protocol, output, k, scores=SCORES):
    module = httpclient if protocol == "http" else grpcclient
    tensor = module.InferInput("SCORES", list(scores.shape), "FP32")
    tensor.set_data_from_numpy(scores)
    requested = module.InferRequestedOutput(output, class_count=k)
    result = clients[protocol].infer("classifier", [tensor], outputs=[requested])
    return result.as_numpy(output)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_top_k_per_batch_item_with_labels(clients, protocol):
    top = classify(clients, protocol, "PROBS", 2)
    assert top.shape == (2, 2)
    assert [[v.decode() for v in row] for row in top] == [
        ["0.700000:1:dog", "0.200000:2:bird"],
        ["4.000000:3", "3.000000:0:cat"],  # index 3 has no label: labels.txt has three
    ]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_integer_outputs_and_k_past_the_class_count(clients, protocol):
    top = classify(clients, protocol, "COUNTS", 10, SCORES[1:] * 10)
    assert [v.decode() for v in top[0]] == ["40:3", "30:0", "20:2", "10:1"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_bytes_output_cannot_be_classified(clients, protocol):
    with pytest.raises(InferenceServerException) as e:
        classify(clients, protocol, "NAMES", 1)
    assert e.value.message() == "class result not available for output due to unsupported type 'BYTES'"


def test_server_metadata_names_the_extensions_served(clients):
    extensions = clients["http"].get_server_metadata()["extensions"]
    for name in ("classification", "sequence", "model_repository", "schedule_policy",
                 "statistics", "system_shared_memory", "logging"):
        assert name in extensions
