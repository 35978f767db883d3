"""Reading model configurations: config.pbtxt text format, and JSON for the load API."""

import json
import os

from google.protobuf import json_format, text_format

from shmserve.errors import ServerError, invalid_arg
from shmserve.proto import ModelConfig


def parse_config_text(text: str) -> ModelConfig:
    """A config.pbtxt's content as a ModelConfig; syntax errors name line and column."""
    try:
        return text_format.Parse(text, ModelConfig())
    except text_format.ParseError as exc:
        message = str(exc)
        if exc.GetLine() is not None:
            # The library prefixes "line:column : " to its message; say it in words.
            message = (f"line {exc.GetLine()}, column {exc.GetColumn()}: "
                       f"{message.split(' : ', 1)[-1]}")
        raise invalid_arg(f"failed to parse model configuration: {message}") from None
    except ValueError as exc:
        # The library lets a few bad values escape unwrapped: an enum given a number beyond
        # 32 bits ("Value out of range").
        raise invalid_arg(f"failed to parse model configuration: {exc}") from None


def parse_config_json(text: str) -> ModelConfig:
    """A ModelConfig from its JSON form (proto or lowerCamel field names, int64 as numbers or
    strings), as the repository load API receives it; unknown fields are errors."""
    # json_format takes any JSON value ("[]" gives an empty config); a config is an object.
    if not text.lstrip().startswith("{"):
        raise invalid_arg("failed to parse model configuration JSON: expected a JSON object")
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise invalid_arg(f"failed to parse model configuration JSON: {exc}") from None
    config = ModelConfig()
    try:
        json_format.ParseDict(_as_triton_reads_it(document, config.DESCRIPTOR), config)
    except (json_format.ParseError, RecursionError) as exc:
        raise invalid_arg(f"failed to parse model configuration JSON: {exc}") from None
    return config


def _as_triton_reads_it(value, descriptor):
    """`value` (a JSON object for message `descriptor`) with what Triton's JSON parser also
    takes put in the form json_format takes: a single value where a repeated field wants a
    list (`"input": {...}`), and enum names in any case (`"kind": "kind_cpu"`)."""
    if type(value) is not dict:
        return value
    fields = descriptor.fields_by_name
    by_json = descriptor.fields_by_camelcase_name
    result = {}
    for key, item in value.items():
        field = fields.get(key) or by_json.get(key)
        if field is not None:
            item = _field_value(field, item)
        result[key] = item
    return result


def _field_value(field, item):
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        value_field = field.message_type.fields_by_name["value"]
        if type(item) is dict:
            return {k: _field_value(value_field, v) for k, v in item.items()}
        return item
    if field.is_repeated:
        items = item if type(item) is list else [item]
        return [_single_value(field, v) for v in items]
    return _single_value(field, item)


def _single_value(field, item):
    if field.message_type is not None:
        return _as_triton_reads_it(item, field.message_type)
    if field.enum_type is not None and type(item) is str \
            and item not in field.enum_type.values_by_name \
            and item.upper() in field.enum_type.values_by_name:
        return item.upper()
    return item


def config_path(model_dir: str, config_name: str | None = None) -> str:
    """The file a model's config is read from: `configs/<config_name>.pbtxt` when
    --model-config-name is given and that file exists, else `config.pbtxt` (as Triton)."""
    if config_name:
        custom = os.path.join(model_dir, "configs", config_name + ".pbtxt")
        if os.path.isfile(custom):
            return custom
    return os.path.join(model_dir, "config.pbtxt")


def read_model_config(model_dir: str, config_name: str | None = None, *,
                      autofill: bool = True) -> ModelConfig:
    """The model's config as written. A missing file gives an empty ModelConfig when
    `autofill` (Triton then completes it from the model), else an error."""
    path = config_path(model_dir, config_name)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        if autofill:
            return ModelConfig()
        raise invalid_arg(f"model configuration file '{path}' does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise invalid_arg(f"failed to read model configuration file '{path}': {exc}") from None
    try:
        return parse_config_text(text)
    except ServerError as exc:
        raise invalid_arg(f"{path}: {exc.message}") from None
