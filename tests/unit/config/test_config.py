"""Model configuration: parsing, Triton's defaults and checks, /config JSON rendering."""

import json

import pytest

import shmserve.proto as proto
from shmserve.config.normalize import decoupled, normalize_config
from shmserve.config.parse import (config_path, parse_config_json, parse_config_text,
                                   read_model_config)
from shmserve.config.render import config_to_json
from shmserve.errors import Code, ServerError

REALISTIC = """
# a Python model with most of the knobs people turn
name: "add_sub"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_STRING dims: [ -1, 2 ] optional: true }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } }
]
dynamic_batching {
  max_queue_delay_microseconds: 5000000000
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy { max_queue_size: 4 timeout_action: DELAY default_timeout_microseconds: 7 }
  priority_queue_policy { key: 2 value: { max_queue_size: 1 } }
}
instance_group [ { kind: KIND_CPU count: 2 }, { name: "fast" } ]
model_transaction_policy { decoupled: true }
parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env" } }
version_policy { specific { versions: [ 1, 3 ] } }
"""

MINIMAL = """
backend: "python"
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def normalized(text: str, name: str = "m", gpus: int = 0):
    return normalize_config(parse_config_text(text), name, gpus)


def rejection(text: str, name: str = "m", gpus: int = 0) -> str:
    with pytest.raises(ServerError) as info:
        normalized(text, name, gpus)
    assert info.value.code == Code.INVALID_ARG
    return info.value.message


# ---- parsing ----

def test_parse_text_gives_our_model_config():
    config = parse_config_text(REALISTIC)
    assert isinstance(config, proto.ModelConfig)
    assert config.input[1].data_type == proto.DataType.Value("TYPE_STRING")
    assert config.dynamic_batching.max_queue_delay_microseconds == 5_000_000_000


@pytest.mark.parametrize("text,where,what", [
    ('name: "a"\nmax_batch_size: x\n', "line 2, column", "Couldn't parse integer"),
    ('name: "a"\nnot_a_field: 1\n', "line 2, column 1", 'no field named "not_a_field"'),
    ('input [ { name: "a" }\n', "line 2", ""),
    ('instance_group { kind: KIND_TPU }', "line 1", "KIND_TPU"),
])
def test_parse_text_errors_name_the_place(text, where, what):
    with pytest.raises(ServerError) as info:
        parse_config_text(text)
    assert info.value.code == Code.INVALID_ARG
    assert info.value.message.startswith("failed to parse model configuration: ")
    assert where in info.value.message and what in info.value.message


def test_parse_json_accepts_numbers_and_strings_for_int64():
    config = parse_config_json('{"name": "m", "input": [{"name": "x", "dims": [-1, "3"]}],'
                               ' "dynamic_batching": {"max_queue_delay_microseconds": 10}}')
    assert list(config.input[0].dims) == [-1, 3]
    assert config.dynamic_batching.max_queue_delay_microseconds == 10


def test_parse_json_takes_what_tritons_parser_takes():
    """A single value where a repeated field wants a list, and enum names in any case."""
    config = parse_config_json(
        '{"name": "m", "input": {"name": "x", "data_type": "type_fp32", "dims": 4},'
        ' "instanceGroup": {"kind": "kind_cpu", "count": 2},'
        ' "parameters": {"p": {"string_value": "v"}},'
        ' "sequence_batching": {"control_input": {"name": "S", "control":'
        ' {"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}}}}')
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [("x", 11, [4])]  # TYPE_FP32
    assert [(g.kind, g.count) for g in config.instance_group] == [(2, 2)]  # KIND_CPU
    assert config.parameters["p"].string_value == "v"
    control = config.sequence_batching.control_input[0].control[0]
    assert list(control.int32_false_true) == [0, 1]


@pytest.mark.parametrize("text", ['{"name": ', '{"nam": "m"}', '{"max_batch_size": "x"}', '[]',
                                  '"name"'])
def test_parse_json_errors_are_invalid_arg(text):
    with pytest.raises(ServerError) as info:
        parse_config_json(text)
    assert info.value.code == Code.INVALID_ARG
    assert info.value.message.startswith("failed to parse model configuration JSON: ")


def test_read_model_config_and_custom_config_name(tmp_path):
    (tmp_path / "config.pbtxt").write_text('name: "default"')
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "h100.pbtxt").write_text('name: "custom"')
    assert read_model_config(str(tmp_path)).name == "default"
    assert read_model_config(str(tmp_path), "h100").name == "custom"
    # Like Triton: a --model-config-name without its file falls back to config.pbtxt.
    assert read_model_config(str(tmp_path), "a100").name == "default"
    assert config_path(str(tmp_path), "h100") == str(tmp_path / "configs" / "h100.pbtxt")


def test_read_model_config_missing_file(tmp_path):
    assert read_model_config(str(tmp_path)) == proto.ModelConfig()
    with pytest.raises(ServerError) as info:
        read_model_config(str(tmp_path), autofill=False)
    assert info.value.code == Code.INVALID_ARG and "does not exist" in info.value.message


def test_read_model_config_syntax_error_names_the_file(tmp_path):
    (tmp_path / "config.pbtxt").write_text('name: "m"\nmax_batch_size: -\n')
    with pytest.raises(ServerError) as info:
        read_model_config(str(tmp_path))
    assert str(tmp_path / "config.pbtxt") in info.value.message
    assert "line 2" in info.value.message


# ---- defaults ----

def test_realistic_config_round_trips_through_json():
    config = normalized(REALISTIC, "add_sub")
    rendered = config_to_json(config)
    assert parse_config_json(json.dumps(rendered)) == config
    assert config_to_json(normalize_config(config, "add_sub", 0)) == rendered


def test_defaults_are_filled_and_rendered():
    rendered = config_to_json(normalized(MINIMAL, "m", gpus=0))
    assert rendered["name"] == "m"
    assert rendered["version_policy"] == {"latest": {"num_versions": 1}}
    assert rendered["max_batch_size"] == 0
    assert rendered["optimization"]["input_pinned_memory"] == {"enable": True}
    assert rendered["optimization"]["output_pinned_memory"] == {"enable": True}
    assert rendered["instance_group"] == [{
        "name": "m", "kind": "KIND_CPU", "count": 1, "gpus": [], "secondary_devices": [],
        "profile": [], "passive": False, "host_policy": ""}]
    assert rendered["input"][0] == {
        "name": "IN", "data_type": "TYPE_FP32", "format": "FORMAT_NONE", "dims": [4],
        "is_shape_tensor": False, "allow_ragged_batch": False, "optional": False,
        "is_non_linear_format_io": False}
    for absent in ("dynamic_batching", "sequence_batching", "ensemble_scheduling",
                   "model_transaction_policy", "response_cache"):
        assert absent not in rendered
    assert rendered["parameters"] == {} and rendered["batch_input"] == []
    assert list(rendered)[:6] == ["name", "platform", "backend", "runtime", "version_policy",
                                  "max_batch_size"]


def test_instance_groups_resolve_kind_name_count_and_gpus():
    text = MINIMAL + """instance_group [ { count: 0 }, { kind: KIND_GPU count: 3 },
                                         { kind: KIND_AUTO gpus: [ 1 ] }, { kind: KIND_MODEL } ]"""
    groups = normalized(text, "m", gpus=2).instance_group
    assert [g.name for g in groups] == ["m_0", "m_1", "m_2", "m_3"]
    assert [proto.ModelInstanceGroup.Kind.Name(g.kind) for g in groups] == [
        "KIND_GPU", "KIND_GPU", "KIND_GPU", "KIND_MODEL"]
    assert [g.count for g in groups] == [1, 3, 1, 1]
    assert [list(g.gpus) for g in groups] == [[0, 1], [0, 1], [1], []]


def test_auto_kind_with_an_absent_gpu_becomes_cpu_and_is_then_rejected():
    # Triton's order: KIND_AUTO listing a GPU the machine lacks resolves to KIND_CPU, and a
    # KIND_CPU group listing GPUs is invalid.
    message = rejection(MINIMAL + "instance_group [ { kind: KIND_AUTO gpus: [ 5 ] } ]", gpus=2)
    assert message == ("instance group m_0 of model m has kind KIND_CPU but specifies one or more "
                       "GPUs")


def test_auto_kind_is_cpu_without_gpus():
    group = normalized(MINIMAL, "m", gpus=0).instance_group[0]
    assert group.kind == proto.ModelInstanceGroup.KIND_CPU and list(group.gpus) == []


def test_scheduler_defaults():
    dynamic = normalized(MINIMAL.replace("python\"", "python\" max_batch_size: 4")
                         + "dynamic_batching {}")
    assert list(dynamic.dynamic_batching.preferred_batch_size) == [4]
    assert list(normalized(MINIMAL + "dynamic_batching {}").dynamic_batching
                .preferred_batch_size) == []
    sequence = normalized(MINIMAL.replace("python\"", "python\" max_batch_size: 2")
                          + "sequence_batching { oldest {} }")
    assert sequence.sequence_batching.max_sequence_idle_microseconds == 1_000_000
    assert list(sequence.sequence_batching.oldest.preferred_batch_size) == [2]
    kept = normalized(MINIMAL + "sequence_batching { max_sequence_idle_microseconds: 5 }")
    assert kept.sequence_batching.max_sequence_idle_microseconds == 5


def test_explicit_values_are_kept():
    text = MINIMAL + """version_policy { all {} } default_model_filename: "main.py"
        optimization { input_pinned_memory { enable: false } }"""
    config = normalized(text)
    assert config.version_policy.WhichOneof("policy_choice") == "all"
    assert config.default_model_filename == "main.py"
    assert config.optimization.input_pinned_memory.enable is False
    assert config.optimization.output_pinned_memory.enable is True


def test_normalize_returns_a_copy():
    original = parse_config_text(MINIMAL)
    normalize_config(original, "m", 0)
    assert original == parse_config_text(MINIMAL)


def test_ensemble_is_left_alone_apart_from_name():
    text = ('platform: "ensemble" '
            'ensemble_scheduling { step [ { model_name: "a" model_version: -1 } ] }')
    config = normalized(text, "ens")
    assert config.name == "ens"
    assert not config.instance_group and not config.HasField("optimization")
    assert config_to_json(config)["ensemble_scheduling"]["step"][0]["model_version"] == -1


def test_decoupled():
    assert decoupled(normalized(REALISTIC, "add_sub"))
    assert not decoupled(normalized(MINIMAL))


# ---- rendering ----

def test_render_prints_64_bit_integers_as_numbers():
    rendered = config_to_json(normalized(REALISTIC, "add_sub"))
    batching = rendered["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 5_000_000_000
    assert batching["priority_levels"] == 2 and batching["default_priority_level"] == 1
    assert batching["default_queue_policy"] == {
        "timeout_action": "DELAY", "default_timeout_microseconds": 7,
        "allow_timeout_override": False, "max_queue_size": 4}
    # JSON object keys are strings, whatever the map's key type.
    assert batching["priority_queue_policy"]["2"]["max_queue_size"] == 1
    assert rendered["input"][1]["dims"] == [-1, 2]
    assert rendered["output"][0]["reshape"] == {"shape": []}
    assert rendered["version_policy"] == {"specific": {"versions": [1, 3]}}
    assert rendered["model_transaction_policy"] == {"decoupled": True}
    assert rendered["parameters"] == {
        "EXECUTION_ENV_PATH": {"string_value": "$$TRITON_MODEL_DIRECTORY/env"}}
    json.dumps(rendered, allow_nan=False)


def test_render_prints_float32_values_as_written():
    text = MINIMAL + """sequence_batching {
        direct { minimum_slot_utilization: 0.1 }
        control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START
                                                    fp32_false_true: [ 0, 0.3 ] } ] } ] }"""
    rendered = config_to_json(normalized(text))["sequence_batching"]
    assert rendered["direct"]["minimum_slot_utilization"] == 0.1
    assert rendered["control_input"][0]["control"][0]["fp32_false_true"] == [0.0, 0.3]
    assert rendered["max_sequence_idle_microseconds"] == 1_000_000
    # Whole floats print as integers, as Triton prints them.
    assert '"fp32_false_true": [0, 0.3]' in json.dumps(rendered)


# ---- validation ----

def test_name_must_match_directory():
    message = rejection('name: "other"' + MINIMAL, "m")
    assert message == ("unexpected directory name 'm' for model 'other', directory name must "
                       "equal model name")


def _io(dims: str, extra: str = "", kind: str = "input") -> str:
    body = f'{kind} [ {{ name: "T" data_type: TYPE_FP32 {dims} {extra} }} ]'
    return 'backend: "python" max_batch_size: 0 ' + body


@pytest.mark.parametrize("text,reason", [
    # backend fields (filled in before normalization, see test_backend_resolution.py)
    ('platform: "onnxruntime_onnx"', "unexpected platform type 'onnxruntime_onnx' for m"),
    ('backend: "pytorch"', "unexpected 'platform' and 'backend' pair, got:, pytorch"),
    ("", "unexpected platform type '' for m"),
    ('backend: "python" max_batch_size: -1', "'max_batch_size' must be non-negative value for m"),
    ('backend: "python" ensemble_scheduling {}', "ensemble scheduling cannot be set for model 'm'"),
    # inputs and outputs
    ('backend: "python" input [ { data_type: TYPE_FP32 dims: [ 1 ] } ]',
     "model input must specify 'name' for m"),
    ('backend: "python" output [ { name: "T" dims: [ 1 ] } ]',
     "model output 'T' must specify 'data_type' for m"),
    (_io(""), "model input 'T' must specify 'dims' for m"),
    (_io("dims: [ 0 ]"), "model input 'T' dimension must be integer >= 1, or -1"),
    (_io("dims: [ -2 ]", kind="output"), "model output 'T' dimension must be integer >= 1"),
    (_io("dims: [ 1 ]", "reshape { shape: [ ] }"),
     "cannot have empty reshape for non-batching model"),
    (_io("dims: [ 4 ]", "reshape { shape: [ 0, 4 ] }"), "reshape dimensions must be integer"),
    (_io("dims: [ 4 ]", "reshape { shape: [ 2, 3 ] }"),
     "model input 'T' has different size for dims and reshape for m"),
    (_io("dims: [ -1 ]", "reshape { shape: [ 4 ] }"), "has different size for dims and reshape"),
    (_io("dims: [ -1, 2 ]", "reshape { shape: [ -1, -1 ] }"),
     "has different number of variable-size dimensions for dims and reshape"),
    (_io("dims: [ -1, 2 ]", "reshape { shape: [ -1, 3 ] }"),
     "has different size for dims and reshape"),
    (_io("dims: [ 4 ]", "format: FORMAT_NHWC"), "model input NHWC/NCHW require 3 dims"),
    (_io("dims: [ 4 ]", "is_shape_tensor: true"), "shape tensors are only supported"),
    (_io("dims: [ 4 ]", "is_non_linear_format_io: true", kind="output"),
     "Non-linear IO format is only supported"),
    ('backend: "python" input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] },'
     ' { name: "A" data_type: TYPE_INT32 dims: [ 2 ] } ]',
     "model input 'A' is specified more than once for m"),
    ('backend: "python" output [ { name: "B" data_type: TYPE_FP32 dims: [ 1 ] },'
     ' { name: "B" data_type: TYPE_FP32 dims: [ 1 ] } ]',
     "model output 'B' is specified more than once for m"),
    # batch inputs and outputs
    ('backend: "python" max_batch_size: 2 batch_input [ { data_type: TYPE_INT32 } ]',
     "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 0 for m"),
    ('backend: "python" max_batch_size: 2 batch_input [ { source_input: "X" } ]',
     "batch input data type must be TYPE_INT32 or TYPE_FP32"),
    ('backend: "python" max_batch_size: 2 '
     'batch_input [ { data_type: TYPE_FP32 source_input: "X" } ]',
     "unknown source input name 'X'"),
    ('backend: "python" batch_output [ { source_input: [ "X", "Y" ] } ]',
     "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 2"),
    (_io("dims: [ 1 ]") + ' batch_output [ { source_input: "T" target_name: "Z" } ]',
     "unknown target output name 'Z'"),
    # dynamic batching
    ('backend: "python" max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 0 ] }',
     "dynamic batching preferred size must be positive for m"),
    ('backend: "python" max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 8 ] }',
     "dynamic batching preferred size must be <= max batch size for m"),
    ('backend: "python" dynamic_batching { priority_levels: 2 }',
     "default priority level must be in range [1, 2] for m"),
    ('backend: "python" dynamic_batching { priority_levels: 2 default_priority_level: 3 }',
     "default priority level must be in range [1, 2] for m"),
    ('backend: "python" dynamic_batching { priority_levels: 2 default_priority_level: 1'
     ' priority_queue_policy { key: 3 value {} } }',
     "priority queue policy must have priority level in range [1, 2] for m"),
    ('backend: "python" dynamic_batching { preserve_ordering: true priority_levels: 2'
     ' default_priority_level: 1 }', "Only one priority level is allowed"),
    ('backend: "python" dynamic_batching { preserve_ordering: true default_queue_policy {'
     ' timeout_action: DELAY default_timeout_microseconds: 5 } }',
     "Queue policy can not have DELAY as timeout action"),
    # sequence batching
    ('backend: "python" sequence_batching {} response_cache { enable: true }',
     "Response Cache does not currently support model m with sequence batching"),
    ('backend: "python" sequence_batching { control_input [ { } ] }',
     "sequence batching control tensor must have a name for m"),
    ('backend: "python" sequence_batching { control_input [ { name: "S" control [ {'
     ' kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }, { name: "S" } ] }',
     "sequence batching control tensor 'S' is specified for multiple control kinds"),
    ('backend: "python" sequence_batching { control_input [ { name: "A" control [ {'
     ' kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] }, { name: "B" control [ {'
     ' kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] } ] }',
     "sequence batching specifies multiple CONTROL_SEQUENCE_END tensors for m"),
    ('backend: "python" sequence_batching { control_input [ { name: "A" control [ {'
     ' kind: CONTROL_SEQUENCE_READY } ] } ] }',
     "must specify exactly one of 'int32_false_true', 'fp32_false_true' or 'bool_false_true'"
     " for CONTROL_SEQUENCE_READY for m"),
    ('backend: "python" sequence_batching { control_input [ { name: "A" control [ {'
     ' kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] fp32_false_true: [ 0, 1 ] } ] } ] }',
     "must specify exactly one of"),
    ('backend: "python" sequence_batching { control_input [ { name: "A" control [ {'
     ' kind: CONTROL_SEQUENCE_START int32_false_true: [ 1 ] } ] } ] }',
     "sequence batching control 'int32_false_true' must have exactly 2 entries"),
    ('backend: "python" sequence_batching { control_input [ { name: "A" control [ {'
     ' kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 int32_false_true: [ 0, 1 ] } ] } ] }',
     "sequence batching must not specify either 'int32_false_true'"),
    ('backend: "python" sequence_batching { control_input [ { name: "A" control [ {'
     ' kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ] }',
     "unexpected data type for control CONTROL_SEQUENCE_CORRID for m"),
    ('backend: "python" max_batch_size: 2 '
     'sequence_batching { oldest { preferred_batch_size: -1 } }',
     "sequence batching preferred batch size must be positive for m"),
    ('backend: "python" max_batch_size: 2 sequence_batching { oldest { preferred_batch_size: 3 } }',
     "sequence batching preferred batch size must be <= max batch size for m"),
    ('backend: "python" sequence_batching { direct { minimum_slot_utilization: 1.5 } }',
     "sequence batching minimum slot utilization must be in range (0.0, 1.0] for m"),
    # response cache, metrics
    ('backend: "python" model_transaction_policy { decoupled: true } '
     'response_cache { enable: true }',
     "Response Cache does not currently support model m with 'decoupled' transaction policy"),
    ('backend: "python" model_metrics { metric_control [ { } ] }',
     "metric control must specify 'metric_identifier'"),
    ('backend: "python" model_metrics { metric_control [ { metric_identifier { } } ] }',
     "metric identifier must specify non-empty 'family'"),
    ('backend: "python" model_metrics { metric_control [ { metric_identifier { family: "f" } } ] }',
     "metric control must specify 'histogram_options'"),
    ('backend: "python" model_metrics { metric_control [ { metric_identifier { family: "f" }'
     ' histogram_options { } } ] }', "histogram options must specify non-empty 'buckets'"),
    ('backend: "python" metric_tags { key: "my team" value: "a" }',
     "metric_tags key 'my team' of model 'm' cannot name the metric label '_my team'"),
    ('backend: "python" metric_tags { key: "_hidden" value: "a" }',
     "metric_tags key '_hidden' of model 'm' cannot name"),
    # instance groups
    ('backend: "python" instance_group [ { kind: KIND_GPU } ]',
     "instance group m_0 of model m has kind KIND_GPU but no GPUs are available"),
    ('backend: "python" instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]',
     "instance group m_0 of model m specifies invalid or unsupported gpu id 0"),
    ('backend: "python" instance_group [ { name: "g" kind: KIND_CPU gpus: [ 0 ] } ]',
     "instance group g of model m has kind KIND_CPU but specifies one or more GPUs"),
    ('backend: "python" instance_group [ { kind: KIND_MODEL gpus: [ 0 ] } ]',
     "instance group m_0 of model m has kind KIND_MODEL but specifies one or more GPUs"),
    ('backend: "python" instance_group [ { kind: KIND_CPU profile: "0" } ]',
     "specifies profile field which is only supported for TensorRT models"),
])
def test_invalid_configs_are_rejected_with_a_reason(text, reason):
    assert reason in rejection(text)


def test_gpu_ids_are_checked_against_the_machine():
    message = rejection('backend: "python" instance_group [ { kind: KIND_GPU gpus: [ 2 ] } ]',
                        gpus=2)
    assert message.endswith("invalid or unsupported gpu id 2. Available GPUs are: 0, 1")


@pytest.mark.parametrize("dims,shape", [
    ("[ 1 ]", "[ ]"), ("[ 2, 3 ]", "[ 6 ]"), ("[ 2, 4, -1, 6 ]", "[ 8, -1, 1, 6 ]"),
    ("[ -1 ]", "[ -1, 1 ]"),
])
def test_compatible_reshapes_are_accepted(dims, shape):
    text = f'''backend: "python" max_batch_size: 1
        input [ {{ name: "T" data_type: TYPE_FP32 dims: {dims} reshape {{ shape: {shape} }} }} ]'''
    assert list(normalized(text).input[0].reshape.shape) == json.loads(shape.replace(" ", ""))
