"""shmserve's `triton_python_backend_utils` (imported by models as `pb_utils`).

The API of Triton's Python backend module of the same name, written for shmserve: our Python
backend puts this module in `sys.modules` under that name before it imports a model, so
`model.py` files written for Triton run unchanged. Names, signatures, constants and error texts follow Triton.
One addition is shmserve's own: `batched_input`, a zero-copy [N, ...] view of an input over a
batch of requests.

Tensors hold a numpy array (or a cupy array for GPU tensors made with `Tensor.from_dlpack`).
BYTES tensors hold object arrays of bytes; BF16 tensors hold their bits as uint16 storage.

The code lives in the package workers/model_api/, one concept per module. This module is the
facade models import: `__all__` is the API a model may reach as `pb_utils.X`, and the few
underscore names below `__all__` are the worker side's hooks. The instance's context those
hooks set lives in one object (workers/model_api/context.py), so that what the worker sets
here is what the package reads; the package's other module-level state (the metric registry)
is not exported, and a test patches it where it lives.
"""

import json
import struct

import numpy as np

from workers.model_api.constants import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_GPU,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    MemoryType,
)
# `X as X`: the worker side's hooks, re-exported on purpose (see below `__all__`).
from workers.model_api.context import (
    _allow_bls as _allow_bls,
    _set_model_context as _set_model_context,
    _set_server_calls as _set_server_calls,
    get_model_dir,
)
from workers.model_api.dtypes import (
    TRITON_STRING_TO_NUMPY,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)
from workers.model_api.errors import TritonError, TritonModelException
from workers.model_api.log import LOGGER_NAME, Logger
from workers.model_api.metrics import Metric, MetricFamily, MetricKind
from workers.model_api.metrics import _metrics_snapshot as _metrics_snapshot  # a hook, re-exported
from workers.model_api.model_config import (
    ModelConfig,
    get_input_config_by_name,
    get_output_config_by_name,
    using_decoupled_model_transaction_policy,
)
from workers.model_api.request import (
    InferenceRequest,
    InferenceTrace,
    PreferredMemory,
    batched_input,
    get_input_tensor_by_name,
)
from workers.model_api.response import (
    InferenceResponse,
    InferenceResponseSender,
    get_output_tensor_by_name,
)
from workers.model_api.server import is_model_ready, load_model, unload_model
from workers.model_api.tensor import Tensor

__all__ = [
    # constants
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "MemoryType",
    # datatypes
    "TRITON_STRING_TO_NUMPY",
    "deserialize_bytes_tensor",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    # errors
    "TritonError",
    "TritonModelException",
    # tensors
    "Tensor",
    # requests and responses
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "PreferredMemory",
    "batched_input",  # shmserve's own
    "get_input_tensor_by_name",
    "get_output_tensor_by_name",
    # model configuration
    "ModelConfig",
    "get_input_config_by_name",
    "get_output_config_by_name",
    "using_decoupled_model_transaction_policy",
    # the instance's context and the server
    "get_model_dir",
    "is_model_ready",
    "load_model",
    "unload_model",
    # logging
    "LOGGER_NAME",
    "Logger",
    # custom metrics
    "Metric",
    "MetricFamily",
    "MetricKind",
    # Triton's module has no __all__, so `from triton_python_backend_utils import *` hands a
    # model the modules it imports too; a model may lean on that.
    "json",
    "np",
    "struct",
]

# The worker side's hooks, imported above: _set_model_context
# (workers/backends/python_import.py), _allow_bls (workers/backends/python.py),
# _set_server_calls (workers/__main__.py), _metrics_snapshot (workers/metrics_report.py). Its
# classes' underscore methods (Tensor._wrap, InferenceRequest._incoming, ...) come with the
# classes.

# The classes present themselves as members of this module, as they did before the split: in
# reprs, in the type names error texts and tracebacks show, and to pickle.
for _cls in (
    InferenceRequest, InferenceResponse, InferenceResponseSender, InferenceTrace, Logger,
    Logger.LogLevel, MemoryType, Metric, MetricFamily, MetricKind, ModelConfig,
    PreferredMemory, Tensor, TritonError, TritonModelException,
):
    _cls.__module__ = __name__
del _cls
