"""A model whose config.pbtxt names only its backend: auto_complete_config supplies the rest."""

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

# Among the longest modules of the suite (pytest --durations): -m "not slow" skips it.
pytestmark = pytest.mark.slow


def test_served_config_is_the_completed_one(server):
    with httpclient.InferenceServerClient(server.http_url) as http:
        cfg = http.get_model_config("autocomplete")
    assert cfg["max_batch_size"] == 4
    assert [(t["name"], t["data_type"], t["dims"]) for t in cfg["input"]] == [
        ("INPUT0", "TYPE_FP32", [-1])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in cfg["output"]] == [
        ("OUTPUT0", "TYPE_FP32", [-1])]
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert grpc.get_model_config("autocomplete").config.max_batch_size == 4
    finally:
        grpc.close()


def _input(data):
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return tensor


def test_completed_model_infers_in_batches_of_up_to_4(server):
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    with httpclient.InferenceServerClient(server.http_url) as http:
        result = http.infer("autocomplete", [_input(data)])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
        with pytest.raises(InferenceServerException, match="batch-size must be <= 4"):
            http.infer("autocomplete", [_input(np.zeros((5, 3), dtype=np.float32))])


def test_a_model_without_config_file_runs_on_the_python_backend(server):
    """autocomplete_bare has no config.pbtxt, only 1/model.py: as Triton, its backend is
    "python" and auto_complete_config supplies the rest."""
    with httpclient.InferenceServerClient(server.http_url) as http:
        cfg = http.get_model_config("autocomplete_bare")
        data = np.ones((2, 3), dtype=np.float32)
        result = http.infer("autocomplete_bare", [_input(data)])
    assert (cfg["name"], cfg["backend"], cfg["default_model_filename"]) == (
        "autocomplete_bare", "python", "model.py")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
