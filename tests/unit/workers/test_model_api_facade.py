"""workers/triton_python_backend_utils.py, the facade over workers/model_api/: models see the
names they always saw, the worker's hooks reach the one context the package reads, and the
classes are the package's own, presenting themselves as members of the facade."""

import os
import pickle
import sys
import traceback
from types import SimpleNamespace

import numpy as np
import pytest

import workers.triton_python_backend_utils as pb_utils
from workers import model_api
from workers.model_api import context, metrics, request, tensor
from workers.model_api.context import CONTEXT

# The public names of triton_python_backend_utils.py before it became a facade over
# workers/model_api/ (less the modules it imported: numpy, json, ..., which were never API).
API_BEFORE_THE_SPLIT = {
    "InferenceRequest", "InferenceResponse", "InferenceResponseSender", "InferenceTrace",
    "LOGGER_NAME", "Logger", "MemoryType", "Metric", "MetricFamily", "MetricKind", "ModelConfig",
    "PreferredMemory", "TRITONSERVER_MEMORY_CPU", "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL", "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL", "TRITON_STRING_TO_NUMPY", "Tensor", "TritonError",
    "TritonModelException", "batched_input", "deserialize_bytes_tensor",
    "get_input_config_by_name", "get_input_tensor_by_name", "get_model_dir",
    "get_output_config_by_name", "get_output_tensor_by_name", "is_model_ready", "load_model",
    "numpy_to_triton_type", "serialize_byte_tensor", "triton_string_to_numpy",
    "triton_to_numpy_type", "unload_model", "using_decoupled_model_transaction_policy",
}

# The modules Triton's own file hands to `import *` (it has no __all__).
STAR_MODULES = {"json", "np", "struct"}

# What the worker side calls, besides the API.
WORKER_HOOKS = {"_allow_bls", "_metrics_snapshot", "_set_model_context", "_set_server_calls"}


def test_the_facade_exports_the_api_it_had_and_no_other_public_name():
    exported = API_BEFORE_THE_SPLIT | STAR_MODULES
    assert set(pb_utils.__all__) == exported
    assert len(pb_utils.__all__) == len(exported)
    public = {n for n in dir(pb_utils) if not n.startswith("_")}
    assert public == exported
    star: dict = {}
    exec("from workers.triton_python_backend_utils import *", star)
    assert set(star) - {"__builtins__"} == exported


def test_the_worker_hooks_are_there():
    assert WORKER_HOOKS <= set(dir(pb_utils))
    assert pb_utils._set_model_context is context._set_model_context
    assert pb_utils._metrics_snapshot is metrics._metrics_snapshot
    assert callable(pb_utils.Tensor._wrap) and callable(pb_utils.InferenceRequest._incoming)


def test_the_packages_state_is_not_copied_into_the_facade():
    """Patching a copy would change nothing the package reads: state is patched where it lives
    (CONTEXT, workers.model_api.metrics), and a stale patch of the facade fails loudly."""
    for name in ("_registry", "_metric_changes", "_instance_name", "_model_dir",
                 "_server_calls", "_bls_allowed", "_control", "_server_call"):
        assert not hasattr(pb_utils, name), name


@pytest.fixture
def fresh_context():
    saved = {name: getattr(CONTEXT, name) for name in CONTEXT.__slots__}
    yield CONTEXT
    for name, value in saved.items():
        setattr(CONTEXT, name, value)


class FakeServerCalls:
    """A worker's channel into the server that answers every call with `value`."""

    arena = None

    def __init__(self, value):
        self.value = value
        self.calls: list = []

    def call(self, kind, args, blocks=()):
        self.calls.append((kind, args))
        yield SimpleNamespace(response=None, value=self.value)


def test_what_the_worker_sets_through_the_facade_is_what_the_package_reads(fresh_context,
                                                                           monkeypatch):
    pb_utils._set_model_context(model_dir="/models/m/1", instance_name="m_0_0")
    assert pb_utils.get_model_dir() == "/models/m/1"
    monkeypatch.setattr(metrics, "_registry", {})
    pb_utils.MetricFamily("f", "f", pb_utils.MetricFamily.GAUGE)
    with pytest.raises(pb_utils.TritonModelException, match="for model 'm_0_0', message"):
        pb_utils.MetricFamily("f", "f", pb_utils.MetricFamily.COUNTER)

    bls = pb_utils.InferenceRequest(model_name="other", requested_output_names=[], inputs=[])
    pb_utils._allow_bls(False)
    with pytest.raises(pb_utils.TritonModelException, match="only supported during the 'exec"):
        bls.exec()
    pb_utils._allow_bls(True)
    with pytest.raises(pb_utils.TritonModelException, match="only inside a shmserve worker"):
        bls.exec()

    server = FakeServerCalls(value=True)
    pb_utils._set_server_calls(server)
    assert pb_utils.is_model_ready("other") is True
    assert server.calls == [("ready", {"model": "other", "version": ""})]


def test_the_classes_are_the_packages_and_present_themselves_as_the_facades():
    assert pb_utils.Tensor is tensor.Tensor
    assert pb_utils.InferenceRequest is request.InferenceRequest
    made_inside = request.InferenceRequest(
        model_name="m", requested_output_names=[], inputs=[tensor.Tensor("x", np.zeros(2))])
    assert isinstance(made_inside, pb_utils.InferenceRequest)
    assert isinstance(made_inside.inputs()[0], pb_utils.Tensor)
    for name in pb_utils.__all__:
        value = getattr(pb_utils, name)
        if isinstance(value, type):
            assert value.__module__ == "workers.triton_python_backend_utils", name
    assert pb_utils.Logger.LogLevel.__module__ == "workers.triton_python_backend_utils"
    line = traceback.format_exception_only(pb_utils.TritonModelException("no"))[-1]
    assert line == "workers.triton_python_backend_utils.TritonModelException: no\n"


def test_a_model_importing_the_module_by_triton_s_name_gets_the_same_objects(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb_utils)
    import triton_python_backend_utils  # as a model imports it

    assert triton_python_backend_utils.Tensor is tensor.Tensor
    assert triton_python_backend_utils.get_model_dir is context.get_model_dir


def test_tensors_and_errors_still_pickle():
    copied = pickle.loads(pickle.dumps(pb_utils.Tensor("t", np.arange(3, dtype=np.int32))))
    assert isinstance(copied, pb_utils.Tensor) and copied.as_numpy().tolist() == [0, 1, 2]
    error = pickle.loads(pickle.dumps(pb_utils.TritonError("e", pb_utils.TritonError.NOT_FOUND)))
    assert repr(error) == "TritonError('e', code=NOT_FOUND)"


def test_no_module_of_the_package_is_over_600_lines():
    folder = os.path.dirname(model_api.__file__)
    for name in os.listdir(folder):
        if name.endswith(".py"):
            with open(os.path.join(folder, name)) as f:
                assert sum(1 for _ in f) <= 600, name
