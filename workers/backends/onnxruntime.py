"""The ONNX Runtime backend: `<version>/model.onnx` run in an onnxruntime.InferenceSession.

Follows Triton's onnxruntime backend where a client or a config can tell: the auto-completed
config (inputs, outputs, batching), the model parameters it reads and their meaning, the load
errors when a config does not match the model. Inputs reach ORT as numpy arrays over the
worker's shared memory (a batch's input as one [N, ...] view when its requests lie back to
back, as they do in a batch's block), which ORT's CPU provider reads in place; ORT allocates
the outputs, and the worker loop copies each request's rows once into the output arena.
(Binding outputs straight into the arena with IOBinding measured no faster per batch here,
and needs each output's shape before the run.)
"""

import ctypes
import logging
import os

import numpy as np

from shmserve.ipc import datatypes
from workers import cuda
from workers.backends import AutoCompleteContext, BackendError, Context
from workers.backends.batch import Output
from workers.backends.parameters import (bool_parameter, default_intra_op_threads, int_parameter,
                                         string_parameters)
from workers.backends.ragged import RaggedBatching
from workers.backends.stacked import RunError, StackedModel
from workers.sequence_extras import extra_tensors

try:
    import onnxruntime as ort
except ImportError:  # the front checks first; this is for a worker started by hand
    raise BackendError("the onnxruntime backend needs the Python package 'onnxruntime', which "
                       "is not installed: pip install 'shmserve[onnx]'") from None

log = logging.getLogger(__name__)

# ORT's element type names (NodeArg.type, "tensor(<name>)") -> config data types.
_CONFIG_TYPES = {
    "float": "TYPE_FP32", "float16": "TYPE_FP16", "double": "TYPE_FP64",
    "bfloat16": "TYPE_BF16", "bool": "TYPE_BOOL", "string": "TYPE_STRING",
    "int8": "TYPE_INT8", "int16": "TYPE_INT16", "int32": "TYPE_INT32", "int64": "TYPE_INT64",
    "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16", "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64",
}
_BF16_ONNX_TYPE = 16  # onnx.TensorProto.BFLOAT16
_WILDCARD = -1


class _Tensor:
    """An input or output of the ONNX model: name, config data type, dims (-1 where the
    model leaves a dimension free)."""

    __slots__ = ("name", "data_type", "dims")

    def __init__(self, arg):
        kind = arg.type
        if not (kind.startswith("tensor(") and kind.endswith(")")):
            raise BackendError(f"unsupported type '{kind}' of '{arg.name}': only tensors "
                               "(ONNX_TYPE_TENSOR) are supported")
        element = kind[len("tensor("):-1]
        if element not in _CONFIG_TYPES:
            raise BackendError(f"unsupported ONNX element type '{element}' of '{arg.name}'")
        self.name = arg.name
        self.data_type = _CONFIG_TYPES[element]
        self.dims = [d if isinstance(d, int) and d >= 0 else _WILDCARD
                     for d in (arg.shape or [])]


def model_path(model_dir: str, version: str, config: dict) -> str:
    """The model file: `default_model_filename` in the version folder, or `model.onnx` inside
    it when that is a folder (a model whose weights lie in external-data files beside it)."""
    path = os.path.join(model_dir, str(version), config.get("default_model_filename")
                        or "model.onnx")
    if os.path.isdir(path):
        path = os.path.join(path, "model.onnx")
    return path


def _session(path: str, options, providers) -> "ort.InferenceSession":
    try:
        return ort.InferenceSession(path, sess_options=options, providers=providers)
    except Exception as exc:  # ORT raises its own exception types, none of them common
        raise BackendError(f"failed to load '{path}': {exc}") from None


def auto_complete(context: AutoCompleteContext) -> dict:
    """Triton's onnxruntime auto-complete: inputs, outputs, max_batch_size and
    dynamic_batching from the model, unless the config lists inputs and outputs already."""
    config = context.config
    name = config.get("name", "")
    input_count = len(config.get("input") or []) + len(config.get("batch_input") or [])
    output_count = len(config.get("output") or [])
    if input_count and output_count:
        return config
    path = model_path(context.model_dir, context.version, config)
    if not os.path.exists(path):
        raise BackendError(f"unable to find '{path}' for model '{name}'")
    options = ort.SessionOptions()
    # Only the signature is read: no time spent optimizing a graph that will not run.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    session = _session(path, options, ["CPUExecutionProvider"])
    inputs = [_Tensor(arg) for arg in session.get_inputs()]
    outputs = [_Tensor(arg) for arg in session.get_outputs()]

    can_batch = all(t.dims and t.dims[0] == _WILDCARD for t in inputs + outputs)
    max_batch_size = int(config.get("max_batch_size") or 0)
    if can_batch:
        if max_batch_size == 0:
            setting = context.settings.get("default-max-batch-size", "4")
            try:
                max_batch_size = max(int(setting), 0)
            except ValueError:
                raise BackendError(f"backend setting 'default-max-batch-size': failed to "
                                   f"convert '{setting}' to integral number") from None
            config["max_batch_size"] = max_batch_size
        if (max_batch_size > 1 and "sequence_batching" not in config
                and "dynamic_batching" not in config):
            config["dynamic_batching"] = {}
    elif max_batch_size != 0:
        raise BackendError(f"autofill failed for model '{name}': model does not support "
                           "batching while non-zero max_batch_size is specified")
    if not input_count:
        config["input"] = [_config_tensor(t, max_batch_size) for t in inputs]
    if not output_count:
        config["output"] = [_config_tensor(t, max_batch_size) for t in outputs]
    return config


def _config_tensor(tensor: _Tensor, max_batch_size: int) -> dict:
    dims = tensor.dims[1:] if max_batch_size > 0 else list(tensor.dims)
    entry = {"name": tensor.name, "data_type": tensor.data_type}
    if not dims:
        # A scalar: [1] in the config; a batching model's is reshaped to no dims.
        dims = [1]
        if max_batch_size > 0:
            entry["reshape"] = {"shape": []}
    entry["dims"] = dims
    return entry


# --- parameters ------------------------------------------------------------------------------


def session_options(config: dict):
    """(SessionOptions, RunOptions) from the model's config, as Triton's backend reads it;
    BackendError naming the parameter for a bad value."""
    name = config.get("name", "")
    parameters = string_parameters(config)
    options = ort.SessionOptions()
    level = int(((config.get("optimization") or {}).get("graph") or {}).get("level") or 0)
    options.graph_optimization_level = {
        -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    }.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    mode = int_parameter(parameters, "execution_mode", name, 0)
    if mode not in (0, 1):
        raise BackendError(f"unable to load model '{name}': parameter 'execution_mode': "
                           f"expected 0 (sequential) or 1 (parallel), got {mode}")
    options.execution_mode = (ort.ExecutionMode.ORT_SEQUENTIAL if mode == 0
                              else ort.ExecutionMode.ORT_PARALLEL)
    intra = int_parameter(parameters, "intra_op_thread_count", name, 0)
    options.intra_op_num_threads = intra if intra > 0 else default_intra_op_threads(config)
    inter = int_parameter(parameters, "inter_op_thread_count", name, 0)
    if inter > 0:
        options.inter_op_num_threads = inter
    arena = bool_parameter(parameters, "enable_mem_arena", name)
    if arena is not None:
        options.enable_cpu_mem_arena = arena
    pattern = bool_parameter(parameters, "enable_mem_pattern", name)
    if pattern is not None:
        options.enable_mem_pattern = pattern
    key = "session.use_device_allocator_for_initializers"
    if key in parameters:
        options.add_session_config_entry(key, parameters[key])
    run_options = ort.RunOptions()
    key = "memory.enable_memory_arena_shrinkage"
    if key in parameters:
        run_options.add_run_config_entry(key, parameters[key])
    return options, run_options


# --- execution providers ---------------------------------------------------------------------

_CPU = "CPUExecutionProvider"
_CUDA = "CUDAExecutionProvider"
_TENSORRT = "TensorrtExecutionProvider"
_OPENVINO = "OpenVINOExecutionProvider"
# TensorRT accelerator parameters Triton takes under their ORT names, by the kind of value.
_TRT_BOOLS = {"trt_dla_enable", "trt_engine_cache_enable", "trt_dump_subgraphs",
              "trt_force_sequential_engine_build", "trt_context_memory_sharing_enable",
              "trt_layer_norm_fp32_fallback", "trt_timing_cache_enable",
              "trt_force_timing_cache", "trt_detailed_build_log",
              "trt_build_heuristics_enable", "trt_sparsity_enable", "trt_cuda_graph_enable",
              "trt_dump_ep_context_model", "trt_int8_use_native_calibration_table"}
_TRT_INTS = {"trt_max_partition_iterations", "trt_min_subgraph_size", "trt_dla_core",
             "trt_builder_optimization_level", "trt_auxiliary_streams",
             "trt_ep_context_embed_mode", "trt_max_workspace_size"}
_TRT_STRINGS = {"trt_engine_cache_path", "trt_engine_cache_prefix", "trt_timing_cache_path",
                "trt_tactic_sources", "trt_extra_plugin_lib_paths", "trt_profile_min_shapes",
                "trt_profile_max_shapes", "trt_profile_opt_shapes", "trt_ep_context_file_path",
                "trt_int8_calibration_table_name"}
# Triton's names of three of them.
_TRT_RENAMED = {"max_workspace_size_bytes": "trt_max_workspace_size",
                "int8_calibration_table_name": "trt_int8_calibration_table_name",
                "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table"}
_PRECISIONS = {"FP16": "trt_fp16_enable", "BF16": "trt_bf16_enable", "INT8": "trt_int8_enable"}


def execution_providers(config: dict, instance_kind: str, device_id: int,
                        available: list) -> list:
    """The providers of an instance's session, best first, as Triton's onnxruntime backend
    chooses them: on a GPU instance, the TensorRT accelerator if the config asks for it and
    CUDA; on any, the OpenVINO accelerator if asked; the CPU last. A provider that onnxruntime
    here lacks is left out with a warning (the model then runs on what there is); a name or a
    parameter Triton does not know fails the load, in Triton's words."""
    name = config.get("name", "")
    parameters = string_parameters(config)
    accelerators = (config.get("optimization") or {}).get("execution_accelerators") or {}
    providers = []
    if instance_kind == "GPU":
        cuda_options = _cuda_options(parameters, name)
        cuda_options["device_id"] = str(device_id)
        for accelerator in accelerators.get("gpu_execution_accelerator") or []:
            kind = accelerator.get("name", "")
            values = accelerator.get("parameters") or {}
            if kind == "tensorrt":
                options = _tensorrt_options(values, name)
                options["device_id"] = str(device_id)
                providers.append((_TENSORRT, options))
            elif kind == "cuda":
                for key, value in values.items():
                    if key in ("do_copy_in_default_stream", "use_ep_level_unified_stream"):
                        bool_parameter(values, key, name)
                    if value:
                        cuda_options[key] = value
            else:
                raise BackendError(f"unknown Execution Accelerator '{kind}' is requested")
        providers.append((_CUDA, cuda_options))
    for accelerator in accelerators.get("cpu_execution_accelerator") or []:
        kind = accelerator.get("name", "")
        if kind != "openvino":
            raise BackendError(f"unknown Execution Accelerator '{kind}' is requested")
        providers.append((_OPENVINO, {"device_type": "CPU"}))
    kept = []
    for provider in providers:
        if provider[0] in available:
            kept.append(provider)
        else:
            log.warning("model '%s' asks for %s, which this onnxruntime does not have (%s): "
                        "it runs without it", name, provider[0], ", ".join(available))
    return kept + [_CPU]


def _cuda_options(parameters: dict, model: str) -> dict:
    """The CUDA provider's options from the model's parameters, with Triton's defaults."""
    options = {"cudnn_conv_algo_search": "EXHAUSTIVE",
               "arena_extend_strategy": "kNextPowerOfTwo", "do_copy_in_default_stream": "1"}
    search = int_parameter(parameters, "cudnn_conv_algo_search", model, 0)
    if search not in (0, 1, 2):
        raise BackendError(f"unsupported cudnn_conv_algo_search value '{search}' is requested")
    options["cudnn_conv_algo_search"] = ("EXHAUSTIVE", "HEURISTIC", "DEFAULT")[search]
    strategy = int_parameter(parameters, "arena_extend_strategy", model, 0)
    if strategy not in (0, 1):
        raise BackendError(f"unsupported arena_extend_strategy value '{strategy}' is requested")
    options["arena_extend_strategy"] = ("kNextPowerOfTwo", "kSameAsRequested")[strategy]
    for key in ("gpu_mem_limit", "do_copy_in_default_stream"):
        if key in parameters:
            options[key] = parameters[key]
    return options


def _tensorrt_options(values: dict, model: str) -> dict:
    options = {}
    for key, value in values.items():
        if key == "precision_mode":
            if value in _PRECISIONS:
                options[_PRECISIONS[value]] = "1"
            elif value != "FP32":
                raise BackendError(f"unsupported precision mode '{value}' is requested")
            continue
        name = _TRT_RENAMED.get(key, key)
        if name in _TRT_BOOLS:
            bool_parameter(values, key, model)
        elif name in _TRT_INTS:
            count = int_parameter(values, key, model, 0)
            if count < 0 and name == "trt_max_workspace_size":
                raise BackendError(f"unable to load model '{model}': parameter '{key}': "
                                   f"failed to convert '{value}' to unsigned long long "
                                   "integral number")
        elif name not in _TRT_STRINGS:
            raise BackendError(f"unknown parameter '{key}' is provided for TensorRT "
                               "Execution Accelerator")
        options[name] = value
    return options


# --- the instance ----------------------------------------------------------------------------


class _Io:
    """One input or output as the config gives it, with what the model expects."""

    __slots__ = ("name", "wire", "dims", "model_shape", "bf16", "state")

    def __init__(self, entry: dict, model: _Tensor, batching: bool):
        self.name = entry["name"]
        self.state = False  # an implicit state output
        self.wire = datatypes.config_to_wire(entry["data_type"])
        self.dims = [int(d) for d in entry.get("dims") or []]
        reshape = entry.get("reshape")
        # The shape the model sees, without the batch dimension (None: the request's own).
        shape = None
        if reshape is not None:
            shape = [int(d) for d in reshape.get("shape") or []]
        elif not model.dims or (batching and len(model.dims) == 1):
            shape = []
        self.model_shape = shape
        self.bf16 = self.wire == "BF16"


class OnnxModel(StackedModel):
    """One instance of an ONNX model (the backend interface's Instance)."""

    def __init__(self, context: Context):
        config = context.model_config
        self._name = config.get("name") or context.model_name
        self._instance_name = context.instance_name
        if (config.get("model_transaction_policy") or {}).get("decoupled"):
            raise BackendError(f"unable to load model '{self._name}': the onnxruntime backend "
                               "does not support decoupled models")
        path = model_path(context.model_dir, context.model_version, config)
        if not os.path.exists(path):
            raise BackendError(f"unable to find '{path}' for model instance "
                               f"'{context.instance_name}'")
        options, self._run_options = session_options(config)
        providers = execution_providers(config, context.instance_kind, context.device_id,
                                        ort.get_available_providers())
        # Inputs in a client's CUDA region are bound where they lie on a CUDA session, and
        # copied to the host for a session on the CPU.
        self._on_gpu = any(p[0] in (_CUDA, _TENSORRT) for p in providers[:-1])
        self._session = _session(path, options, providers)
        self._max_batch_size = int(config.get("max_batch_size") or 0)
        model_inputs = {arg.name: _Tensor(arg) for arg in self._session.get_inputs()}
        required = len(model_inputs)
        # An initializer that is also a graph input has a default a request may override: a
        # config may list it (as optional) like any input.
        for arg in self._session.get_overridable_initializers():
            model_inputs.setdefault(arg.name, _Tensor(arg))
        model_outputs = {arg.name: _Tensor(arg) for arg in self._session.get_outputs()}
        self._start_sequences(context)
        self._ragged = RaggedBatching.from_config(config)
        sequence_inputs, state_outputs = extra_tensors(config)
        # Triton counts a batch input once, however many targets it names.
        self._check_input_count(config, required,
                                len(sequence_inputs) + len(self._ragged.batch_inputs))
        self._inputs = (self._validate("input", config.get("input") or [], model_inputs)
                        + self._validate("input", sequence_inputs, model_inputs, dims=False))
        targets = iter(self._validate("input", self._ragged.target_entries(), model_inputs,
                                      dims=False))
        self._batch_feeds = [(batch_input, [next(targets) for _ in batch_input.targets])
                             for batch_input in self._ragged.batch_inputs]
        self._outputs = self._validate("output", config.get("output") or [], model_outputs)
        for io in self._validate("output", state_outputs, model_outputs, dims=False):
            io.state = True
            self._outputs.append(io)
        self._output_names = [io.name for io in self._outputs]
        self._by_value = any(io.bf16 for io in self._inputs + self._outputs)

    def _validate(self, kind: str, entries: list, model: dict, dims: bool = True) -> list:
        """Triton's checks of the config's inputs or outputs against the model's (`dims`
        false: a sequence control or state, whose shape the model may give with or without
        the trailing [1])."""
        name = self._name
        batching = self._max_batch_size > 0
        ios = []
        for entry in entries:
            io_name = entry["name"]
            tensor = model.get(io_name)
            if tensor is None:
                raise BackendError(f"unable to load model '{name}', unexpected inference "
                                   f"{kind} '{io_name}', allowed {kind}s are: "
                                   f"{', '.join(sorted(model))}")
            if entry["data_type"] != tensor.data_type:
                raise BackendError(f"unable to load model '{name}', configuration expects "
                                   f"datatype {entry['data_type']} for {kind} '{io_name}', "
                                   f"model provides {tensor.data_type}")
            reshape = entry.get("reshape")
            shape = [int(d) for d in (reshape.get("shape") or [] if reshape is not None
                                      else entry.get("dims") or [])]
            if kind == "input" and entry.get("optional") and batching:
                raise BackendError(f"unable to load model '{name}', optional input "
                                   f"'{io_name}' is not supported for models that support "
                                   "batching")
            if kind == "input" and io_name in self._ragged.ragged:
                self._check_ragged(entry, tensor)
            elif kind == "output" and io_name in self._ragged.batch_outputs:
                pass  # its shape follows an input's, not the model's
            elif dims and not tensor.dims:
                if any(d != 1 for d in shape):
                    raise BackendError(
                        f"unable to load model '{name}', scalar tensor '{io_name}', should "
                        "only provide 1 in the model configuration when the model doesn't "
                        f"support batching. Model configuration provided: {_shape(shape)}.")
            elif dims:
                _compare_dims(name, io_name, tensor.dims, shape, batching,
                              exact=kind == "output")
            ios.append(_Io(entry, tensor, batching))
        return ios

    def _check_input_count(self, config: dict, required: int, extra: int) -> None:
        """Triton's count: the model's required inputs are the config's inputs that are not
        optional, the sequence controls and states, and one for each batch input."""
        expected = extra + sum(not entry.get("optional") for entry in config.get("input") or [])
        if required != expected:
            raise BackendError(f"unable to load model '{self._name}', configuration expects "
                               f"{expected} inputs, model provides {required}")

    def _check_ragged(self, entry: dict, tensor: _Tensor) -> None:
        """A ragged input reaches the model as one flat tensor: the model must take [-1]."""
        name = entry["name"]
        if entry.get("optional"):
            raise BackendError(f"unable to load model '{self._name}', configuration expects "
                               f"model provides input with shape [-1] for ragged input "
                               f"'{name}', which is not supported for optional input")
        if tensor.dims != [_WILDCARD]:
            raise BackendError(f"unable to load model '{self._name}', configuration expects "
                               f"model provides input with shape [-1]  for ragged input "
                               f"'{name}', model provides {_shape(tensor.dims)}")

    def finalize(self) -> None:
        self._session = None

    def _feeds(self, stacked: dict) -> dict:
        return {io.name: self._to_ort(io, array) for io, array in stacked.items()}

    def _to_ort(self, io: _Io, array):
        if cuda.is_device_array(array):
            if self._on_gpu and not io.bf16:
                return _OnDevice(array)
            array = cuda.to_numpy(array)
        if io.wire == "BYTES":
            # ORT's string tensors take str: each element's bytes as UTF-8.
            flat = [v.decode("utf-8") if isinstance(v, bytes) else str(v)
                    for v in array.reshape(-1)]
            array = np.array(flat, dtype=np.object_).reshape(array.shape)
        if not self._by_value:
            return array
        if io.bf16:
            return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                np.ascontiguousarray(array), _BF16_ONNX_TYPE)
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))

    def _infer(self, feeds: dict) -> list:
        if any(type(value) is _OnDevice for value in feeds.values()):
            return self._infer_bound(feeds)
        try:
            if not self._by_value:
                return self._session.run(self._output_names, feeds, self._run_options)
            values = self._session.run_with_ort_values(self._output_names, feeds,
                                                        self._run_options)
        except Exception as exc:  # ORT's own exception types share no useful base
            raise RunError("INTERNAL", f"Failed to process the request(s) for model instance "
                                       f"'{self._instance_name}', message: {exc}") from None
        return [_bf16_array(v) if io.bf16 else v.numpy()
                for io, v in zip(self._outputs, values)]

    def _infer_bound(self, feeds: dict) -> list:
        """A run whose inputs include device memory (a client's CUDA region), bound where it
        lies; the outputs come back to the host."""
        binding = self._session.io_binding()
        for name, value in feeds.items():
            if type(value) is _OnDevice:
                array = value.array
                binding.bind_input(name, "cuda", cuda.device_id(array), array.dtype.type,
                                   list(array.shape), array.data.ptr)
            elif isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for name in self._output_names:
            binding.bind_output(name, "cpu")
        try:
            self._session.run_with_iobinding(binding, self._run_options)
        except Exception as exc:  # ORT's own exception types share no useful base
            raise RunError("INTERNAL", f"Failed to process the request(s) for model instance "
                                       f"'{self._instance_name}', message: {exc}") from None
        return [_bf16_array(v) if io.bf16 else v.numpy()
                for io, v in zip(self._outputs, binding.get_outputs())]

    def _output(self, io: _Io, array, size) -> Output:
        shape = ([size] if size is not None else []) + io.dims
        if -1 in io.dims or array.shape != tuple(shape):
            # A reshaped or scalar output: the config's dims, the free ones from the model.
            array = array.reshape(shape if shape.count(-1) <= 1 else array.shape)
        array = np.ascontiguousarray(array)
        return Output(io.name, io.wire, list(array.shape), array)


class _OnDevice:
    """A feed that is device memory (a cupy array), to be bound rather than passed."""

    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array if array.flags.c_contiguous else cuda.device_copy(array)


def _bf16_array(value) -> np.ndarray:
    """The bits of a BF16 OrtValue as uint16 (numpy has no bfloat16)."""
    array = np.empty(value.shape(), dtype=np.uint16)
    if array.size:
        ctypes.memmove(array.ctypes.data, value.data_ptr(), array.nbytes)
    return array


def _shape(dims) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _compare_dims(model: str, tensor: str, model_dims: list, dims: list, batching: bool,
                  exact: bool) -> None:
    """Triton's check of a config's dims against the model's shape (a free model dimension
    takes any size, and for outputs must be free in the config too)."""
    if batching:
        if not model_dims or model_dims[0] != _WILDCARD:
            raise BackendError(
                f"model '{model}', tensor '{tensor}': for the model to support batching the "
                "shape should have at least 1 dimension and the first dimension must be -1; "
                f"but shape expected by the model is {_shape(model_dims)}")
        full = [_WILDCARD] + dims
        if not _dims_match(model_dims, full, exact):
            raise BackendError(
                f"model '{model}', tensor '{tensor}': the model expects {len(model_dims)} "
                f"dimensions (shape {_shape(model_dims)}) but the model configuration "
                f"specifies {len(full)} dimensions (an initial batch dimension because "
                "max_batch_size > 0 followed by the explicit tensor shape, making complete "
                f"shape {_shape(full)})")
    elif not _dims_match(model_dims, dims, exact):
        raise BackendError(
            f"model '{model}', tensor '{tensor}': the model expects {len(model_dims)} "
            f"dimensions (shape {_shape(model_dims)}) but the model configuration specifies "
            f"{len(dims)} dimensions (shape {_shape(dims)})")


def _dims_match(model_dims: list, dims: list, exact: bool) -> bool:
    if len(model_dims) != len(dims):
        return False
    return all(m == d for m, d in zip(model_dims, dims) if exact or m != _WILDCARD)


def load(context: Context) -> OnnxModel:
    return OnnxModel(context)
