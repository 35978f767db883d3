"""The PyTorch backend: a TorchScript `<version>/model.pt` run by torch.jit.

Follows Triton's pytorch backend (libtorch) where a client or a config can tell: no
auto-complete (TorchScript keeps no shapes), the rules that bind the config's inputs and
outputs to `forward()`, the parameters it reads, its datatypes (strings as `List[str]`), its
load and execute errors. A batch's inputs reach `forward()` as tensors over the worker's shared
memory (torch.from_numpy shares it), one [N, ...] tensor per input; each request gets its rows
of the outputs. Each instance is a process of its own, so the process-wide torch settings a
parameter changes (threads, JIT modes, cuDNN) are the instance's alone.

Binding, as Triton does it:
- inputs: by `forward()` argument name when every config input names one; else by the index in
  `<name>__<index>` when every config input has one; else in config order. A `forward()` taking
  a single `Dict[str, Tensor]` gets the inputs by their config names.
- outputs: by the index in `<name>__<index>` when every config output has one; else the config
  order is the order of the tuple `forward()` returns (or its single tensor).
"""

import logging
import os
import re

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
    import torch
except ImportError:  # the front checks first; this is for a worker started by hand
    raise BackendError("the pytorch backend needs the Python package 'torch', which is not "
                       "installed: pip install 'shmserve[torch]'") from None

log = logging.getLogger(__name__)

# Config data types torch has (Triton's list: no unsigned type wider than 8 bits, no BF16).
_TORCH_TYPES = {
    "TYPE_BOOL": torch.bool, "TYPE_UINT8": torch.uint8, "TYPE_INT8": torch.int8,
    "TYPE_INT16": torch.int16, "TYPE_INT32": torch.int32, "TYPE_INT64": torch.int64,
    "TYPE_FP16": torch.float16, "TYPE_FP32": torch.float32, "TYPE_FP64": torch.float64,
}
_CONFIG_TYPES = {dtype: name for name, dtype in _TORCH_TYPES.items()}
_STRING = "TYPE_STRING"  # a List[str] in TorchScript
_NAMED_INDEX = re.compile(r"__(\d+)$")


def auto_complete(context: AutoCompleteContext) -> dict:
    """Nothing to complete: a TorchScript file does not record its tensors' shapes."""
    return context.config


def model_path(model_dir: str, version, config: dict) -> str:
    return os.path.join(model_dir, str(version),
                        config.get("default_model_filename") or "model.pt")


# --- parameters ------------------------------------------------------------------------------


class Options:
    """The model's parameters as Triton's pytorch backend reads them."""

    def __init__(self, config: dict):
        name = config.get("name", "")
        parameters = string_parameters(config)

        def flag(key, default=None):
            value = bool_parameter(parameters, key, name)
            return default if value is None else value

        self.optimized_execution = not flag("DISABLE_OPTIMIZED_EXECUTION", False)
        self.inference_mode = flag("INFERENCE_MODE", True)
        self.cache_cleaning = flag("ENABLE_CACHE_CLEANING", False)
        self.cudnn = not flag("DISABLE_CUDNN", False)
        # None: torch's own default is left alone.
        self.tensor_fuser = flag("ENABLE_TENSOR_FUSER")
        self.jit_profiling = flag("ENABLE_JIT_PROFILING")
        self.jit_executor = flag("ENABLE_JIT_EXECUTOR")
        self.weight_sharing = flag("ENABLE_WEIGHT_SHARING", False)
        intra = int_parameter(parameters, "INTRA_OP_THREAD_COUNT", name, 0)
        self.intra_op_threads = intra if intra > 0 else default_intra_op_threads(config)
        self.inter_op_threads = int_parameter(parameters, "INTER_OP_THREAD_COUNT", name, 0)

    def apply(self) -> None:
        """Set torch's process-wide settings: this process runs one instance."""
        torch.set_num_threads(self.intra_op_threads)
        if self.inter_op_threads > 0:
            try:
                torch.set_num_interop_threads(self.inter_op_threads)
            except RuntimeError:  # only possible before torch's first parallel work
                log.warning("INTER_OP_THREAD_COUNT: torch's inter-op pool was already started")
        torch._C._set_graph_executor_optimize(self.optimized_execution)
        torch.backends.cudnn.enabled = self.cudnn
        if self.tensor_fuser is not None:
            torch._C._jit_set_texpr_fuser_enabled(self.tensor_fuser)
        if self.jit_profiling is not None:
            torch._C._jit_set_profiling_mode(self.jit_profiling)
        if self.jit_executor is not None:
            torch._C._jit_set_profiling_executor(self.jit_executor)


# --- binding the config to forward() ---------------------------------------------------------


class _Io:
    """A config input or output, and where it sits among forward()'s arguments or results."""

    __slots__ = ("name", "config_type", "wire", "dtype", "index", "model_shape", "state")

    def __init__(self, entry: dict, index: int, state: bool = False):
        self.name = entry["name"]
        self.state = state  # an implicit state output
        self.config_type = entry["data_type"]
        self.wire = datatypes.config_to_wire(self.config_type)
        self.dtype = _TORCH_TYPES.get(self.config_type)
        self.index = index
        self.model_shape = None  # the front hands inputs over reshaped already


def _named_index(name: str):
    match = _NAMED_INDEX.search(name)
    return int(match.group(1)) if match else None


def _check_type(model: str, kind: str, entry: dict, batching: bool) -> None:
    config_type = entry["data_type"]
    if config_type not in _TORCH_TYPES and config_type != _STRING:
        raise BackendError(f"unsupported datatype {config_type} for {kind} '{entry['name']}' "
                           f"for model '{model}'")
    if config_type == _STRING:
        reshape = entry.get("reshape")
        dims = (reshape.get("shape") or []) if reshape is not None else entry.get("dims") or []
        if len(dims) + batching > 1:
            raise BackendError(f"Triton only supports 1 dimensional List of String as {kind} "
                               f"for '{entry['name']}' for model '{model}'")


def _index_of(model: str, kind: str, name: str) -> int:
    """The <index> of a sequence control's or state's name, which must have one."""
    index = _named_index(name)
    if index is None:
        raise BackendError(f"PyTorch model '{model}' is using sequence batching but {kind} "
                           f"'{name}' does not follow the <name>__<index> naming convention.")
    return index


def bind_inputs(model: str, config: dict, arguments: list, sequence_inputs: list = (),
                batch_inputs: list = ()) -> tuple[list, bool]:
    """The config's inputs, a sequence model's control and state inputs (`sequence_inputs`)
    and the targets of its batch inputs (`batch_inputs`, as config entries) bound to
    `forward()`'s arguments (torch.Argument, `self` left out), and whether forward() takes
    them as one dict; BackendError saying why they do not fit. A batch input's target is bound
    by the rule the config's inputs follow, after them in config order."""
    entries = config.get("input") or []
    expected = len(entries) + len(sequence_inputs) + len(batch_inputs)
    batching = int(config.get("max_batch_size") or 0) > 0
    kinds = [arg.type.kind() for arg in arguments]
    as_dict = len(arguments) == 1 and kinds[0] == "DictType"
    if not as_dict:
        if "DictType" in kinds[1:]:
            raise BackendError("Multiple inputs of kind DictType were detected. Only a single "
                               "input of type Dict(str, Tensor) is supported.")
        for arg, kind in zip(arguments, kinds):
            if kind not in ("TensorType", "ListType"):
                raise BackendError(
                    f"An input of type '{arg.type}' was detected in the model. Only a single "
                    "input of type Dict(str, Tensor) or input(s) of type Tensor are supported.")
        if len(arguments) != expected:
            raise BackendError(f"unable to load model '{model}', configuration expects "
                               f"{expected} inputs, model provides {len(arguments)}")
    if not entries:
        raise BackendError("model configuration must contain at least one input, none were "
                           "specified.")
    for entry in [*entries, *sequence_inputs]:
        _check_type(model, "input", entry, batching)
    names = [entry["name"] for entry in entries]
    targets = [entry["name"] for entry in batch_inputs]
    argument_names = [arg.name for arg in arguments]
    if as_dict:
        indexes = list(range(expected))
    else:
        if all(name in argument_names for name in names):
            indexes = [_argument_index(model, argument_names, name) for name in names + targets]
        elif all(_named_index(name) is not None for name in names):
            indexes = [_batch_target_index(model, name) for name in names + targets]
        else:
            log.warning("input(s) of model '%s' are neither arguments of forward() nor follow "
                        "the <name>__<index> naming convention: they are bound in the "
                        "configuration's order", model)
            indexes = list(range(len(entries) + len(targets)))
        indexes += [_index_of(model, "input", e["name"]) for e in sequence_inputs]
        names += targets + [e["name"] for e in sequence_inputs]
        for name, index in zip(names, indexes):
            if index >= len(arguments):
                raise BackendError(
                    f"unable to load model '{model}', input '{name}' names forward() argument "
                    f"{index}, but forward() takes {len(arguments)} inputs")
        if len(set(indexes)) != len(indexes):
            raise BackendError(f"unable to load model '{model}', inputs {', '.join(names)} "
                               "name the same forward() argument twice")
    ios = [_Io(entry, index)
           for entry, index in zip([*entries, *batch_inputs, *sequence_inputs], indexes)]
    if not as_dict:
        for io in ios:
            arg, kind = arguments[io.index], kinds[io.index]
            if (io.config_type == _STRING) != (kind == "ListType"):
                raise BackendError(
                    f"unable to load model '{model}', input '{io.name}' is {io.config_type}, "
                    f"but forward() argument '{arg.name}' is {arg.type} (TYPE_STRING inputs "
                    "are List[str], every other type a Tensor)")
    return ios, as_dict


def _argument_index(model: str, argument_names: list, name: str) -> int:
    if name not in argument_names:
        raise BackendError(f"unable to load model '{model}', batch input '{name}' is not an "
                           f"argument of forward(), which takes {', '.join(argument_names)}")
    return argument_names.index(name)


def _batch_target_index(model: str, name: str) -> int:
    index = _named_index(name)
    if index is None:
        raise BackendError(f"unable to load model '{model}', batch input '{name}' does not "
                           "follow the <name>__<index> naming convention, as the inputs do")
    return index


def bind_outputs(model: str, config: dict, returns, state_outputs: list = ()) -> list:
    """The config's outputs, and a sequence model's state outputs, bound to the results of
    `forward()`, whose declared return type is `returns` (a fixed tuple's length is checked
    here, anything else at execute)."""
    entries = config.get("output") or []
    batching = int(config.get("max_batch_size") or 0) > 0
    if not entries:
        raise BackendError("model configuration must contain at least one output, none were "
                           "specified.")
    for entry in entries:
        _check_type(model, "output", entry, batching)
    names = [entry["name"] for entry in entries]
    if all(_named_index(name) is not None for name in names):
        indexes = [_named_index(name) for name in names]
    else:
        indexes = list(range(len(entries)))
    for entry in state_outputs:
        _check_type(model, "output", entry, batching)
        names.append(entry["name"])
        indexes.append(_index_of(model, "state", entry["name"]))
    count = None
    if returns is not None:
        kind = returns.kind()
        count = (len(returns.elements()) if kind == "TupleType"
                 else 1 if kind in ("TensorType", "ListType") else None)
    if count is not None:
        for name, index in zip(names, indexes):
            if index >= count:
                raise BackendError(
                    f"unable to load model '{model}': the output {name} in the model "
                    "configuration refers to an output index which doesn't exist. This model "
                    f"has {count} outputs")
    return [_Io(entry, index, state=position >= len(entries))
            for position, (entry, index) in enumerate(zip([*entries, *state_outputs], indexes))]


# --- the instance ----------------------------------------------------------------------------


class TorchModel(StackedModel):
    """One instance of a TorchScript model (the backend interface's Instance)."""

    def __init__(self, context: Context):
        config = context.model_config
        self._name = config.get("name") or context.model_name
        self._instance_name = context.instance_name
        if (config.get("model_transaction_policy") or {}).get("decoupled"):
            raise BackendError(f"unable to load model '{self._name}': the pytorch backend "
                               "does not support decoupled models")
        self._options = Options(config)
        self._options.apply()
        if self._options.weight_sharing:
            log.info("ENABLE_WEIGHT_SHARING: model '%s' runs each instance in a process of its "
                     "own, which holds its own weights", self._name)
        self._device = torch.device("cpu")
        if context.instance_kind == "GPU":
            if torch.cuda.is_available():
                self._device = torch.device("cuda", context.device_id)
            else:
                log.warning("model instance '%s' is KIND_GPU but torch has no CUDA device here: "
                            "it runs on the CPU", context.instance_name)
        path = model_path(context.model_dir, context.model_version, config)
        if not os.path.isfile(path):
            raise BackendError(f"unable to find '{path}' for model instance '{self._name}'")
        with torch.inference_mode(self._options.inference_mode):
            try:
                self._module = torch.jit.load(path, map_location=self._device)
            except Exception as exc:  # torch raises RuntimeError and its own c10 errors
                raise BackendError(f"failed to load model '{self._name}': {exc}") from None
        try:
            schema = self._module._c._get_method("forward").schema
        except RuntimeError:
            raise BackendError(f"unable to load model '{self._name}': the TorchScript module "
                               "has no forward() method") from None
        arguments = list(schema.arguments)
        if arguments and arguments[0].type.kind() == "ClassType":
            arguments = arguments[1:]  # self
        self._max_batch_size = int(config.get("max_batch_size") or 0)
        self._start_sequences(context)
        self._ragged = RaggedBatching.from_config(config)
        sequence_inputs, state_outputs = extra_tensors(config)
        targets = self._ragged.target_entries()
        inputs, self._as_dict = bind_inputs(self._name, config, arguments, sequence_inputs,
                                            targets)
        count = len(config.get("input") or [])
        self._inputs = inputs[:count] + inputs[count + len(targets):]
        bound = iter(inputs[count:count + len(targets)])
        self._batch_feeds = [(batch_input, [next(bound) for _ in batch_input.targets])
                             for batch_input in self._ragged.batch_inputs]
        self._argument_count = len(arguments)
        returns = schema.returns[0].type if len(schema.returns) == 1 else None
        self._outputs = bind_outputs(self._name, config, returns, state_outputs)
        for io in self._outputs:
            if io.name in self._ragged.batch_outputs and io.config_type == _STRING:
                raise BackendError(f"unable to load model '{self._name}', batch output "
                                   f"'{io.name}' is TYPE_STRING, which batch outputs do not "
                                   "support")
        self._cuda = self._device.type == "cuda"

    def finalize(self) -> None:
        self._module = None
        if self._cuda:
            torch.cuda.empty_cache()

    def _feeds(self, stacked: dict):
        if self._as_dict:
            return {io.name: self._to_torch(io, array) for io, array in stacked.items()}
        feeds = [None] * self._argument_count
        for io, array in stacked.items():
            feeds[io.index] = self._to_torch(io, array)
        if any(value is None for value in feeds):
            missing = [io.name for io in self._inputs if io not in stacked]
            raise ValueError(f"missing input(s) {', '.join(missing)}")
        return feeds

    def _to_torch(self, io: _Io, array):
        if io.config_type == _STRING:
            # A List[str]: each element's bytes as UTF-8 (UnicodeDecodeError is a ValueError).
            return [v.decode("utf-8") if isinstance(v, bytes) else str(v)
                    for v in array.reshape(-1)]
        if cuda.is_device_array(array) and not self._cuda:
            array = cuda.to_numpy(array)  # a client's CUDA region, for an instance on the CPU
        if cuda.is_device_array(array):
            tensor = torch.from_dlpack(array)  # a client's CUDA region, not copied
        else:
            if not array.flags.writeable:
                # A small input inside the request's frame: torch tensors are writable.
                array = array.copy()
            tensor = torch.from_numpy(array)
        return tensor.to(self._device) if tensor.device != self._device else tensor

    def _infer(self, feeds) -> list:
        try:
            with torch.inference_mode(self._options.inference_mode), torch.no_grad():
                if self._as_dict:
                    result = self._module(feeds)
                else:
                    result = self._module(*feeds)
        except Exception as exc:  # whatever the model's code raised
            raise RunError("INTERNAL", f"PyTorch execute failure: {exc}") from None
        finally:
            if self._cuda and self._options.cache_cleaning:
                torch.cuda.empty_cache()
        values = _results(result)
        outputs = []
        for io in self._outputs:
            if io.index >= len(values):
                raise RunError("INVALID_ARG",
                               f"The output {io.name} in the model configuration refers to an "
                               "output index which doesn't exist. This model has "
                               f"{len(values)} outputs")
            outputs.append(self._result(io, values[io.index]))
        return outputs

    def _result(self, io: _Io, value):
        """An output as an array (cupy on the GPU) or a list of str, checked against the
        config."""
        if isinstance(value, list):
            if io.config_type != _STRING:
                raise RunError("INVALID_ARG", f"configuration expects datatype "
                                              f"{io.config_type} for output '{io.name}', model "
                                              "provides List[str]")
            return value
        model_type = _CONFIG_TYPES.get(value.dtype, f"{value.dtype}")
        if model_type != io.config_type:
            raise RunError("INVALID_ARG", f"configuration expects datatype {io.config_type} "
                                          f"for output '{io.name}', model provides {model_type}")
        if value.dim() == 0:
            raise RunError("INVALID_ARG", f"output '{io.name}' is a scalar which is not "
                                          "supported.")
        value = value.detach().contiguous()
        if value.device.type == "cuda":
            if cuda.available():
                return cuda.from_dlpack(value)  # stays on its GPU
            value = value.cpu()
        return value.numpy()

    def _output(self, io: _Io, rows, size) -> Output:
        if io.config_type == _STRING:
            array = np.empty(len(rows), dtype=np.object_)
            array[:] = [v.encode("utf-8") for v in rows]
            return Output(io.name, io.wire, [len(rows)], array)
        return Output(io.name, io.wire, list(rows.shape), rows)


def _results(result) -> list:
    """forward()'s outputs as a list of tensors and lists of str, in Triton's rules."""
    if isinstance(result, torch.Tensor):
        return [result]
    values = list(result) if isinstance(result, tuple) else [result]
    for index, value in enumerate(values):
        if isinstance(value, torch.Tensor):
            continue
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            continue
        if isinstance(value, list) and isinstance(result, tuple):
            kind = type(value[0]).__name__ if value else "?"
            raise RunError("INTERNAL", f"PyTorch execute failure: output at index {index} "
                                       "must be of type Tensor or List[str], received "
                                       f"List[{kind}]")
        raise RunError("INTERNAL", "PyTorch execute failure: output must be of type Tensor, "
                                   "List[str] or Tuple containing one of these two types. It "
                                   "should not be a List / Dictionary of Tensors or a Scalar")
    return values


def load(context: Context) -> TorchModel:
    return TorchModel(context)
