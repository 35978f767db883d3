"""A model config as Triton serves it: defaults filled in, then validated.

Follows Triton's NormalizeModelConfig / NormalizeInstanceGroup (defaults) and
ValidateModelConfig / ValidateModelIOConfig / ValidateInstanceGroup (checks), with Triton's
error texts where they are readable. The backend fields are filled in and checked by
backend.py.
"""

import re

from shmserve.config.backend import ENSEMBLE_PLATFORM, check_backend_fields
from shmserve.errors import invalid_arg
from shmserve.proto import (DataType, ModelConfig, ModelInput, ModelInstanceGroup,
                            ModelQueuePolicy, ModelSequenceBatching)

# Backends whose CPU instance groups get two instances when the config gives no count (Triton's
# SetDefaultInstanceCount).
_TWO_CPU_INSTANCES = ("onnxruntime", "tensorflow")
SEQUENCE_IDLE_DEFAULT_MICROSECONDS = 1_000_000
WILDCARD_DIM = -1
_TAG_KEY = re.compile(r"(?![_])[A-Za-z0-9_]*")

_Control = ModelSequenceBatching.Control
_BOOLEAN_CONTROLS = (_Control.CONTROL_SEQUENCE_START, _Control.CONTROL_SEQUENCE_END,
                     _Control.CONTROL_SEQUENCE_READY)
_CORRID_TYPES = (DataType.Value("TYPE_UINT64"), DataType.Value("TYPE_INT64"),
                 DataType.Value("TYPE_UINT32"), DataType.Value("TYPE_INT32"),
                 DataType.Value("TYPE_STRING"))


def decoupled(config: ModelConfig) -> bool:
    """Whether the model may send zero or many responses per request."""
    return config.model_transaction_policy.decoupled


def normalize_config(config: ModelConfig, model_name: str, gpu_count: int) -> ModelConfig:
    """A validated copy of `config` (of the model in directory `model_name`) with Triton's
    defaults, for a machine with `gpu_count` GPUs. Raises INVALID_ARG with the reason."""
    result = ModelConfig()
    result.CopyFrom(config)
    _check_enums(result, model_name)
    if not result.name:
        result.name = model_name
    elif result.name != model_name:
        raise invalid_arg(f"unexpected directory name '{model_name}' for model "
                          f"'{result.name}', directory name must equal model name")
    if not result.HasField("version_policy"):
        result.version_policy.latest.num_versions = 1
    _check_metric_tags(result)
    check_backend_fields(result)
    if result.platform == ENSEMBLE_PLATFORM:
        # The steps are checked against their models once those are loaded
        # (scheduling/ensemble.py); here, what the ensemble's own config must be.
        _check_ensemble(result)
        return result

    _fill_defaults(result)
    _normalize_instance_groups(result, gpu_count)
    _check_model(result)
    _check_io(result)
    _check_instance_groups(result, gpu_count)
    return result


def _check_enums(message, model_name: str) -> None:
    """Protobuf takes any number for an enum field (`data_type: 99`); nothing after this
    would know what such a value means."""
    for field, value in message.ListFields():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            # No map of the config has enum values; some have message values.
            if field.message_type.fields_by_name["value"].message_type is None:
                continue
            value = value.values()
        elif not field.is_repeated:
            value = (value,)
        if field.enum_type is not None:
            for number in value:
                if number not in field.enum_type.values_by_number:
                    raise invalid_arg(f"unknown value {number} of '{field.name}' in the "
                                      f"configuration of model '{model_name}'")
        elif field.message_type is not None:
            for item in value:
                _check_enums(item, model_name)


def _fill_defaults(config: ModelConfig) -> None:
    scheduling = config.WhichOneof("scheduling_choice")
    if scheduling == "dynamic_batching":
        batching = config.dynamic_batching
        if not batching.preferred_batch_size and config.max_batch_size > 0:
            batching.preferred_batch_size.append(config.max_batch_size)
    elif scheduling == "sequence_batching":
        batching = config.sequence_batching
        if batching.max_sequence_idle_microseconds == 0:
            batching.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_MICROSECONDS
        if (batching.HasField("oldest") and not batching.oldest.preferred_batch_size
                and config.max_batch_size > 0):
            batching.oldest.preferred_batch_size.append(config.max_batch_size)
    optimization = config.optimization
    if not optimization.HasField("input_pinned_memory"):
        optimization.input_pinned_memory.enable = True
    if not optimization.HasField("output_pinned_memory"):
        optimization.output_pinned_memory.enable = True


def _normalize_instance_groups(config: ModelConfig, gpu_count: int) -> None:
    if not config.instance_group:
        # Triton names the implicit group after the model (not "<model>_0").
        config.instance_group.add(name=config.name)
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == ModelInstanceGroup.KIND_AUTO:
            on_gpus = gpu_count > 0 and all(0 <= gpu < gpu_count for gpu in group.gpus)
            group.kind = ModelInstanceGroup.KIND_GPU if on_gpus else ModelInstanceGroup.KIND_CPU
        if group.count < 1:
            group.count = (2 if group.kind == ModelInstanceGroup.KIND_CPU
                           and config.backend in _TWO_CPU_INSTANCES else 1)
        if group.kind == ModelInstanceGroup.KIND_GPU and not group.gpus:
            group.gpus.extend(range(gpu_count))


def _check_model(config: ModelConfig) -> None:
    name = config.name
    if config.max_batch_size < 0:
        raise invalid_arg(f"'max_batch_size' must be non-negative value for {name}")
    if config.HasField("ensemble_scheduling"):
        raise invalid_arg(f"ensemble scheduling cannot be set for model '{name}' whose "
                          f"platform is not {ENSEMBLE_PLATFORM}")
    if config.HasField("dynamic_batching"):
        _check_dynamic_batching(config)
    if config.HasField("sequence_batching"):
        _check_sequence_batching(config)
    if decoupled(config) and config.response_cache.enable:
        raise invalid_arg(f"Response Cache does not currently support model {name} with "
                          "'decoupled' transaction policy. Please disable the response cache.")
    for control in config.model_metrics.metric_control:
        _check_metric_control(control)


def _check_ensemble(config: ModelConfig) -> None:
    name = config.name
    if not config.HasField("ensemble_scheduling"):
        raise invalid_arg(f"ensemble scheduling must be set for ensemble {name} whose platform "
                          f"is {ENSEMBLE_PLATFORM}")
    if config.max_batch_size < 0:
        raise invalid_arg(f"'max_batch_size' must be non-negative value for {name}")
    if config.instance_group:
        raise invalid_arg(f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        raise invalid_arg(f"optimization should not be specified for ensemble '{name}'")
    if config.model_warmup:
        raise invalid_arg(f"model_warmup can not be specified for ensemble '{name}'")
    _check_io(config)


def _check_dynamic_batching(config: ModelConfig) -> None:
    name, batching = config.name, config.dynamic_batching
    for size in batching.preferred_batch_size:
        if size <= 0:
            raise invalid_arg(f"dynamic batching preferred size must be positive for {name}")
        if size > config.max_batch_size:
            raise invalid_arg(
                f"dynamic batching preferred size must be <= max batch size for {name}")
    levels = batching.priority_levels
    if levels != 0:
        if not 1 <= batching.default_priority_level <= levels:
            raise invalid_arg(
                f"default priority level must be in range [1, {levels}] for {name}")
        for level in batching.priority_queue_policy:
            if not 1 <= level <= levels:
                raise invalid_arg(f"priority queue policy must have priority level in range "
                                  f"[1, {levels}] for {name}")
    if batching.preserve_ordering:
        if levels > 1:
            raise invalid_arg("Only one priority level is allowed when 'preserve_ordering' is "
                              f"true for {name}")
        policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
        if any(p.default_timeout_microseconds != 0
               and p.timeout_action == ModelQueuePolicy.DELAY for p in policies):
            raise invalid_arg("Queue policy can not have DELAY as timeout action when "
                              f"'preserve_ordering' is true for {name}")


def _check_sequence_batching(config: ModelConfig) -> None:
    name, batching = config.name, config.sequence_batching
    if config.response_cache.enable:
        raise invalid_arg(f"Response Cache does not currently support model {name} with "
                          "sequence batching scheduler. Please disable the response cache.")
    _check_control_inputs(batching, name)
    if batching.HasField("oldest"):
        for size in batching.oldest.preferred_batch_size:
            if size <= 0:
                raise invalid_arg(
                    f"sequence batching preferred batch size must be positive for {name}")
            if size > config.max_batch_size:
                raise invalid_arg("sequence batching preferred batch size must be <= max "
                                  f"batch size for {name}")
    if batching.HasField("direct"):
        utilization = batching.direct.minimum_slot_utilization
        if not 0.0 <= utilization <= 1.0:
            raise invalid_arg("sequence batching minimum slot utilization must be in range "
                              f"(0.0, 1.0] for {name}")


def _check_control_inputs(batching, name: str) -> None:
    seen_tensors = set()
    seen_kinds = set()
    for control_input in batching.control_input:
        if not control_input.name:
            raise invalid_arg(f"sequence batching control tensor must have a name for {name}")
        if control_input.name in seen_tensors:
            raise invalid_arg(f"sequence batching control tensor '{control_input.name}' is "
                              f"specified for multiple control kinds for {name}")
        seen_tensors.add(control_input.name)
        for control in control_input.control:
            kind = _Control.Kind.Name(control.kind)
            if control.kind in seen_kinds:
                raise invalid_arg(f"sequence batching specifies multiple {kind} tensors "
                                  f"for {name}")
            seen_kinds.add(control.kind)
            given = [field for field in ("int32_false_true", "fp32_false_true",
                                         "bool_false_true") if getattr(control, field)]
            if control.kind in _BOOLEAN_CONTROLS:
                if len(given) != 1:
                    raise invalid_arg(
                        "sequence batching must specify exactly one of 'int32_false_true', "
                        f"'fp32_false_true' or 'bool_false_true' for {kind} for {name}")
                if len(getattr(control, given[0])) != 2:
                    raise invalid_arg(f"sequence batching control '{given[0]}' must have "
                                      f"exactly 2 entries for {kind} for {name}")
            else:
                if given:
                    raise invalid_arg(
                        "sequence batching must not specify either 'int32_false_true', "
                        f"'fp32_false_true' or 'bool_false_true' for {kind} for {name}")
                if control.data_type not in _CORRID_TYPES:
                    raise invalid_arg(
                        f"unexpected data type for control {kind} for {name}. Allowed data "
                        "types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and "
                        "TYPE_STRING")


def _check_metric_tags(config: ModelConfig) -> None:
    # Each tag becomes the Prometheus label `_<key>`, which must be a valid label name and
    # not one of the names Prometheus reserves (a leading `__`).
    for key in config.metric_tags:
        if not _TAG_KEY.fullmatch(key):
            raise invalid_arg(f"metric_tags key '{key}' of model '{config.name}' cannot name "
                              f"the metric label '_{key}': use letters, digits and '_', not "
                              "starting with '_'")


def _check_metric_control(control) -> None:
    if not control.HasField("metric_identifier"):
        raise invalid_arg("metric control must specify 'metric_identifier'")
    if not control.metric_identifier.family:
        raise invalid_arg("metric identifier must specify non-empty 'family'")
    if not control.HasField("histogram_options"):
        raise invalid_arg("metric control must specify 'histogram_options'")
    if not control.histogram_options.buckets:
        raise invalid_arg("histogram options must specify non-empty 'buckets'")


def _check_io(config: ModelConfig) -> None:
    for kind, tensors in (("input", config.input), ("output", config.output)):
        names = set()
        for tensor in tensors:
            reason = _io_problem(tensor, kind, config.max_batch_size)
            if reason:
                raise invalid_arg(f"{reason} for {config.name}")
            if tensor.name in names:
                # Triton silently keeps the first of two same-named tensors; say so instead.
                raise invalid_arg(f"model {kind} '{tensor.name}' is specified more than once "
                                  f"for {config.name}")
            names.add(tensor.name)
    reason = _batch_io_problem(config)
    if reason:
        raise invalid_arg(f"{reason} for {config.name}")


def _io_problem(tensor, kind: str, max_batch_size: int) -> str:
    prefix = f"model {kind} "
    if not tensor.name:
        return prefix + "must specify 'name'"
    prefix += f"'{tensor.name}' "
    if tensor.data_type == DataType.Value("TYPE_INVALID"):
        return prefix + "must specify 'data_type'"
    if not tensor.dims:
        return prefix + "must specify 'dims'"
    has_reshape = tensor.HasField("reshape")
    if has_reshape and not tensor.reshape.shape and max_batch_size == 0:
        return prefix + ("cannot have empty reshape for non-batching model as scalar tensors "
                         "are not supported")
    if any(d < 1 and d != WILDCARD_DIM for d in tensor.dims):
        return prefix + (f"dimension must be integer >= 1, or {WILDCARD_DIM} to indicate a "
                         "variable-size dimension")
    if has_reshape:
        reason = _reshape_problem(list(tensor.dims), list(tensor.reshape.shape))
        if reason:
            return prefix + reason
    if (kind == "input" and tensor.format in (ModelInput.FORMAT_NHWC, ModelInput.FORMAT_NCHW)
            and len(tensor.dims) != 3):
        return "model input NHWC/NCHW require 3 dims"
    if tensor.is_shape_tensor:
        return "shape tensors are only supported for TensorRT platform"
    if tensor.is_non_linear_format_io:
        return "Non-linear IO format is only supported for the TensorRT platform"
    return ""


def _reshape_problem(dims: list[int], shape: list[int]) -> str:
    if any(d < 1 and d != WILDCARD_DIM for d in shape):
        return (f"reshape dimensions must be integer >= 1, or {WILDCARD_DIM} to indicate a "
                "variable-size dimension")
    if shape == [] and _element_count(dims) == 1:
        return ""  # [1] (or [1, 1], ...) to a scalar
    # Compare the fixed-size runs between variable dims: [2, 4, -1, 6] -> [8, -1, 1, 6] is
    # fine because 2 * 4 == 8 and 6 == 1 * 6.
    dims_runs, shape_runs = _fixed_runs(dims), _fixed_runs(shape)
    if len(dims_runs) != len(shape_runs):
        if WILDCARD_DIM in dims and WILDCARD_DIM in shape:
            return "has different number of variable-size dimensions for dims and reshape"
        return "has different size for dims and reshape"
    if dims_runs != shape_runs:
        return "has different size for dims and reshape"
    return ""


def _element_count(dims: list[int]) -> int:
    count = 1
    for d in dims:
        if d == WILDCARD_DIM:
            return WILDCARD_DIM
        count *= d
    return count


def _fixed_runs(dims: list[int]) -> list[int]:
    runs = [1]
    for d in dims:
        if d == WILDCARD_DIM:
            runs.append(1)
        else:
            runs[-1] *= d
    return runs


def _batch_io_problem(config: ModelConfig) -> str:
    inputs = {tensor.name for tensor in config.input}
    outputs = {tensor.name for tensor in config.output}
    for batch_input in config.batch_input:
        if len(batch_input.source_input) != 1:
            kind = type(batch_input).Kind.Name(batch_input.kind)
            return (f"batch input kind '{kind}' expects 1 source input, got "
                    f"{len(batch_input.source_input)}")
        if batch_input.data_type not in (DataType.Value("TYPE_INT32"),
                                         DataType.Value("TYPE_FP32")):
            return "batch input data type must be TYPE_INT32 or TYPE_FP32"
        if batch_input.source_input[0] not in inputs:
            return f"unknown source input name '{batch_input.source_input[0]}'"
    for batch_output in config.batch_output:
        if len(batch_output.source_input) != 1:
            kind = type(batch_output).Kind.Name(batch_output.kind)
            return (f"batch output kind '{kind}' expects 1 source input, got "
                    f"{len(batch_output.source_input)}")
        if batch_output.source_input[0] not in inputs:
            return f"unknown source input name '{batch_output.source_input[0]}'"
        targets = set()
        for target in batch_output.target_name:
            if target not in outputs:
                return f"unknown target output name '{target}'"
            if target in targets:
                return f"target output name '{target}' can only be specified once"
            targets.add(target)
    return ""


def _check_instance_groups(config: ModelConfig, gpu_count: int) -> None:
    # A KIND_GPU group on a machine without GPUs is an error, as in Triton: its normalization
    # gives such a group no GPUs and its validation rejects that ("no GPUs are available").
    # The Python backend does not change this, so neither do we.
    for group in config.instance_group:
        where = f"instance group {group.name} of model {config.name}"
        if group.kind == ModelInstanceGroup.KIND_GPU:
            if not group.gpus:
                raise invalid_arg(f"{where} has kind KIND_GPU but no GPUs are available")
            for gpu in group.gpus:
                if not 0 <= gpu < gpu_count:
                    available = ", ".join(str(g) for g in range(gpu_count))
                    raise invalid_arg(f"{where} specifies invalid or unsupported gpu id {gpu}. "
                                      f"Available GPUs are: {available}")
        elif group.gpus:
            kind = ModelInstanceGroup.Kind.Name(group.kind)
            raise invalid_arg(f"{where} has kind {kind} but specifies one or more GPUs")
        if group.profile:
            raise invalid_arg(f"{where} specifies profile field which is only supported for "
                              "TensorRT models")
