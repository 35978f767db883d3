"""Generated bad input for the config decoders: config.pbtxt text (the repository's own configs
with tokens spliced in, random token text, structured configs with any field value and unknown
enum numbers) and JSON configs. What parses and normalizes must give a signature and survive
the text and JSON round trips (fuzz_helpers.config_property); anything else is a ServerError
with a client-facing code.
"""

import contextlib
import os

import orjson
from google.protobuf import json_format, text_format
from hypothesis import given
from hypothesis import strategies as st

from shmserve import proto
from shmserve.config.normalize import normalize_config
from shmserve.config.parse import parse_config_json, parse_config_text
from shmserve.errors import ServerError
from tests.conftest import ROOT
from tests.unit.fuzz.fuzz_helpers import FUZZ, JSON, NAMES, config_property, outcome


# ---------------------------------------------------------------- configs


def _repository_configs() -> list[str]:
    texts = []
    for folder in ("model_repository", os.path.join("tests", "models")):
        base = os.path.join(ROOT, folder)
        for name in sorted(os.listdir(base)):
            path = os.path.join(base, name, "config.pbtxt")
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as f:
                    texts.append(f.read())
    return texts


REPOSITORY_CONFIGS = _repository_configs()
PBTXT_TOKENS = st.sampled_from(
    ["{", "}", "[", "]", ":", ",", "-1", "0", "99", "2147483648", "9223372036854775808",
     '"x"', "TYPE_FP32", "KIND_GPU", "KIND_AUTO", "name", "input", "output", "dims",
     "data_type", "reshape", "shape", "max_batch_size", "instance_group", "kind", "count",
     "gpus", "dynamic_batching", "preferred_batch_size", "sequence_batching", "control_input",
     "control", "batch_input", "source_input", "platform", "ensemble", "backend", "python",
     "\n", "#", "'", "\\", "\x00", "é"])


@FUZZ
@given(st.sampled_from(REPOSITORY_CONFIGS).flatmap(lambda text: st.builds(
    lambda cuts: _splice(text, cuts), st.lists(st.tuples(
        st.integers(0, len(text)), st.integers(0, 12), st.lists(PBTXT_TOKENS, max_size=3)),
        min_size=1, max_size=3))))
def test_config_mutated_repository_configs(text):
    config_property(text)


@FUZZ
@given(st.lists(PBTXT_TOKENS, max_size=30).map(" ".join))
def test_config_random_token_text(text):
    config_property(text)


def _splice(text: str, cuts) -> str:
    for at, width, tokens in cuts:
        text = text[:at] + " ".join(tokens) + text[at + width:]
    return text


ENUM_NUMBERS = st.one_of(st.integers(0, 16), st.integers(-(2**31), 2**31 - 1))


@st.composite
def model_configs(draw):
    """Structured configs with any field value, unknown enum numbers included."""
    config = proto.ModelConfig(name="m", backend=draw(st.sampled_from(["python", "", "onnx"])),
                               max_batch_size=draw(st.integers(-2, 9)))
    for kind in ("input", "output"):
        for _ in range(draw(st.integers(0, 2))):
            tensor = getattr(config, kind).add(name=draw(NAMES), data_type=draw(ENUM_NUMBERS),
                                               dims=draw(st.lists(st.integers(-2, 2**40),
                                                                  max_size=3)))
            if draw(st.booleans()):
                tensor.reshape.shape.extend(draw(st.lists(st.integers(-2, 8), max_size=3)))
    for _ in range(draw(st.integers(0, 2))):
        config.instance_group.add(kind=draw(ENUM_NUMBERS), count=draw(st.integers(-2, 3)),
                                  gpus=draw(st.lists(st.integers(-2, 3), max_size=2)))
    if draw(st.booleans()):
        config.dynamic_batching.preferred_batch_size.extend(
            draw(st.lists(st.integers(-2, 12), max_size=2)))
        config.dynamic_batching.priority_levels = draw(st.integers(0, 3))
        config.dynamic_batching.default_priority_level = draw(st.integers(0, 4))
    elif draw(st.booleans()):
        for _ in range(draw(st.integers(1, 2))):
            control_input = config.sequence_batching.control_input.add(name=draw(NAMES))
            control = control_input.control.add(kind=draw(ENUM_NUMBERS),
                                                data_type=draw(ENUM_NUMBERS))
            control.int32_false_true.extend(draw(st.lists(st.integers(0, 1), max_size=3)))
    for _ in range(draw(st.integers(0, 1))):
        config.batch_input.add(kind=draw(ENUM_NUMBERS), data_type=draw(ENUM_NUMBERS),
                               source_input=draw(st.lists(NAMES, max_size=2)))
    for _ in range(draw(st.integers(0, 1))):
        config.batch_output.add(kind=draw(ENUM_NUMBERS), source_input=draw(
            st.lists(NAMES, max_size=2)), target_name=draw(st.lists(NAMES, max_size=2)))
    return config


@FUZZ
@given(model_configs())
def test_config_structured_values(config):
    config_property(text_format.MessageToString(config))


def _repository_json_configs() -> list[str]:
    texts = []
    for text in REPOSITORY_CONFIGS:
        with contextlib.suppress(ServerError):  # a test model's config is broken on purpose
            texts.append(json_format.MessageToJson(parse_config_text(text)))
    return texts


JSON_TOKENS = st.sampled_from(['{', '}', '[', ']', ':', ',', '"x"', '-1', '1e400', '"1"',
                               'null', 'true', '"TYPE_FP32"', '"KIND_GPU"', '99',
                               '9223372036854775808', '"dims"', '"maxBatchSize"'])


@FUZZ
@given(st.one_of(st.sampled_from(_repository_json_configs()).flatmap(lambda text: st.builds(
    lambda cuts: _splice(text, cuts), st.lists(st.tuples(
        st.integers(0, len(text)), st.integers(0, 8), st.lists(JSON_TOKENS, max_size=2)),
        min_size=1, max_size=2))), JSON.map(lambda v: orjson.dumps(v).decode()), st.dictionaries(
    st.sampled_from(["name", "max_batch_size", "maxBatchSize", "input", "instance_group",
                     "dynamic_batching", "parameters", "x"]), JSON, max_size=4).map(
        lambda d: orjson.dumps(d).decode()), st.text(max_size=40)))
def test_config_json(text):
    config = outcome("config_json", parse_config_json, text)
    if config is not None:
        outcome("config_normalize", normalize_config, config, config.name or "m", 0)


def test_config_enum_number_beyond_32_bits():
    """protobuf's text parser raised ValueError for it, not ParseError (found by atheris)."""
    config_property('input [ { name: "IN" data_type: 5555555555555555555555 dims: [ 1 ] } ]')
