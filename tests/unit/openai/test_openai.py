"""The OpenAI routes' pure parts: request schemas and their 422 details, chat templates
(rendered as transformers renders them), the restrictions' flags, and how a request becomes a
model's inputs under each backend's convention. The routes on the wire: tests/e2e/test_openai.py."""

import json

import numpy as np
import pytest

from shmserve.inference import InferResponse, OutputTensor
from shmserve.ipc import datatypes
from shmserve.openai import chat_templates, conventions, restrictions
from shmserve.openai.conventions import RouteError, TextModel
from shmserve.openai.schemas import (ChatCompletionRequest, CompletionRequest, EmbeddingRequest,
                                     SchemaError, parse)
from shmserve.signature import ModelSignature, TensorSpec


def spec(name, datatype, dims=(1,), optional=True):
    return TensorSpec(name, datatype, dims, None, optional)


def model(backend="python", batch=0, *specs, outputs=()):
    inputs = {s.name: s for s in specs}
    return TextModel("m", backend, ModelSignature(batch, inputs, {o.name: o for o in outputs}),
                     True)


# --- schemas -----------------------------------------------------------------------------

def test_schema_defaults_follow_the_api():
    body = parse(ChatCompletionRequest, b'{"model": "m", "messages": [{"role": "user", '
                                        b'"content": "hi"}]}')
    assert (body.temperature, body.top_p, body.n, body.stream) == (0.7, 1, 1, False)
    body = parse(CompletionRequest, b'{"model": "m", "prompt": "x"}')
    assert (body.temperature, body.max_tokens, body.echo) == (1, None, False)


@pytest.mark.parametrize("body, kind, loc", [
    (b"", "missing", ["body"]),
    (b"nul", "json_invalid", ["body", 3]),
    (b"3", "model_attributes_type", ["body"]),
    (b'{"prompt": "x"}', "missing", ["body", "model"]),
    (b'{"model": "m", "prompt": "x", "n": 0}', "greater_than_equal", ["body", "n"]),
    (b'{"model": "m", "prompt": "x", "seed": 1e30}', "int_parsing_size", ["body", "seed"]),
    (b'{"model": "m", "prompt": "x", "stream_options": {"include_usage": "maybe"}}',
     "bool_parsing", ["body", "stream_options", "include_usage"]),
])
def test_schema_errors_are_fastapi_s_detail(body, kind, loc):
    with pytest.raises(SchemaError) as refused:
        parse(CompletionRequest, body)
    (error,) = refused.value.detail
    assert error["type"] == kind and error["loc"] == loc
    json.dumps(refused.value.detail)  # what the 422 body holds must be JSON


def test_chat_messages_are_told_apart_by_role():
    body = parse(ChatCompletionRequest, json.dumps({"model": "m", "messages": [
        {"role": "system", "content": "s"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "r", "tool_call_id": "c1"}]}).encode())
    assert [m.role for m in body.messages] == ["system", "assistant", "tool"]
    with pytest.raises(SchemaError) as refused:
        parse(ChatCompletionRequest, b'{"model": "m", "messages": [{"role": "robot", '
                                     b'"content": "x"}]}')
    assert refused.value.detail[0]["type"] == "union_tag_invalid"


def test_embedding_input_is_text_or_tokens():
    assert parse(EmbeddingRequest, b'{"model": "m", "input": [1, 2]}').input == [1, 2]
    with pytest.raises(SchemaError):
        parse(EmbeddingRequest, b'{"model": "m", "input": []}')


# --- chat templates ----------------------------------------------------------------------

def write(folder, name, text):
    (folder / name).write_text(text)
    return folder


def test_template_renders_as_transformers_does(tmp_path):
    # Blocks trimmed (the newline after a tag goes), loop controls, tojson keeping non-ASCII,
    # special tokens from the config (an AddedToken dict too).
    template = ("{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}\n"
                "{{ bos_token }}{{ m.role }}={{ m.content | tojson }}\n{% endfor %}"
                "{% if add_generation_prompt %}>{% endif %}")
    write(tmp_path, "tokenizer_config.json", json.dumps(
        {"chat_template": template, "bos_token": {"content": "<s>"}}))
    rendered = chat_templates.load(str(tmp_path)).render(
        [{"role": "system", "content": "x"}, {"role": "user", "content": "é"}])
    assert rendered == '<s>user="é"\n>'


def test_named_templates_and_the_tool_use_one(tmp_path):
    write(tmp_path, "tokenizer_config.json", json.dumps({"chat_template": [
        {"name": "default", "template": "plain"},
        {"name": "tool_use", "template": "{{ tools[0].function.name }}"}]}))
    template = chat_templates.load(str(tmp_path))
    assert template.render([]) == "plain"
    assert template.render([], tools=[{"type": "function", "function": {"name": "f"}}]) == "f"


def test_template_files_beside_the_config_and_the_override(tmp_path):
    write(tmp_path, "chat_template.jinja", "from jinja")
    assert chat_templates.load(str(tmp_path)).render([]) == "from jinja"
    override = write(tmp_path, "mine.jinja", "mine").joinpath("mine.jinja")
    assert chat_templates.load(str(tmp_path), str(override)).render([]) == "mine"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert chat_templates.load(str(empty)) is None


def test_a_template_that_raises_says_so(tmp_path):
    write(tmp_path, "tokenizer_config.json",
          json.dumps({"chat_template": "{{ raise_exception('no system role') }}"}))
    with pytest.raises(chat_templates.ChatTemplateError, match="no system role"):
        chat_templates.load(str(tmp_path)).render([])


def test_the_sandbox_refuses_unsafe_templates(tmp_path):
    write(tmp_path, "tokenizer_config.json",
          json.dumps({"chat_template": "{{ messages.__class__.__mro__ }}"}))
    with pytest.raises(chat_templates.ChatTemplateError):
        chat_templates.load(str(tmp_path)).render([])


def test_the_bundled_textgen_tokenizer():
    template = chat_templates.load("model_repository/textgen/tokenizer")
    assert template.render([{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]) \
        == "System: Be brief.\nUser: Hi\nAssistant:"


# --- restrictions ------------------------------------------------------------------------

def test_restrictions_parse_as_triton_s_frontend():
    parsed = restrictions.parse([["inference,metrics", "X-Key", "v"], ["health", "h", "w"]])
    assert parsed == {"inference": ("X-Key", "v"), "metrics": ("X-Key", "v"),
                      "health": ("h", "w")}
    with pytest.raises(ValueError, match="Unknown API 'shared-memory'"):
        restrictions.parse([["shared-memory", "k", "v"]])
    with pytest.raises(ValueError, match="can not be specified in multiple config groups"):
        restrictions.parse([["inference", "k", "v"], ["inference", "k2", "v"]])
    assert restrictions.refusal(("X-Key", "v"), {"x-key": "v"}) is None
    assert b"authentication_error" in restrictions.refusal(("X-Key", "v"), {"x-key": "w"})


# --- conventions -------------------------------------------------------------------------

def inputs_of(request) -> dict:
    out = {}
    for t in request.inputs:
        if t.datatype == "BYTES":
            values = [v.decode() for v in datatypes.deserialize_bytes(t.data)]
        else:
            values = np.frombuffer(t.data, datatypes.numpy_dtype(t.datatype)).tolist()
        out[t.name] = (t.datatype, t.shape, values)
    return out


def test_tensorrt_llm_names_as_the_model_declares_them():
    trt = model("tensorrtllm", 8, spec("text_input", "BYTES", (1,), False),
                spec("max_tokens", "INT32"), spec("stop_words", "BYTES", (-1,)),
                spec("temperature", "FP32"), spec("seed", "UINT64"),
                spec("return_num_output_tokens", "BOOL"))
    body = parse(CompletionRequest, b'{"model": "m", "prompt": "p", "stop": ["a", "b"], '
                                    b'"top_p": 0.5, "seed": 7}')
    request, echo = conventions.generation_request(trt, "p", body, 16)
    assert not echo
    assert inputs_of(request) == {
        "text_input": ("BYTES", [1, 1], ["p"]), "max_tokens": ("INT32", [1, 1], [16]),
        "stop_words": ("BYTES", [1, 2], ["a", "b"]), "temperature": ("FP32", [1, 1], [1.0]),
        "seed": ("UINT64", [1, 1], [7]), "return_num_output_tokens": ("BOOL", [1, 1], [True])}


def test_vllm_gets_sampling_parameters_as_json():
    vllm = model("vllm", 0, spec("text_input", "BYTES", (1,), False), spec("stream", "BOOL"),
                 spec("sampling_parameters", "BYTES"), spec("exclude_input_in_output", "BOOL"))
    body = parse(ChatCompletionRequest, b'{"model": "m", "messages": [{"role": "user", '
                                        b'"content": "x"}], "max_completion_tokens": 5, '
                                        b'"stop": "z", "user": "u"}')
    request, _ = conventions.generation_request(vllm, "p", body, 16)
    sent = inputs_of(request)
    sampling = json.loads(sent.pop("sampling_parameters")[2][0])
    assert sampling["max_tokens"] == 5 and sampling["stop"] == "z"
    assert "user" not in sampling and "messages" not in sampling
    assert sent == {"text_input": ("BYTES", [1], ["p"]), "stream": ("BOOL", [1], [False]),
                    "exclude_input_in_output": ("BOOL", [1], [True])}


def test_a_model_without_text_input_or_stop_is_refused_clearly():
    body = parse(CompletionRequest, b'{"model": "m", "prompt": "p", "stop": "x"}')
    with pytest.raises(RouteError, match="has no input 'text_input'"):
        conventions.generation_request(model(), "p", body, 16)
    with pytest.raises(RouteError, match="takes no stop sequences"):
        conventions.generation_request(model("python", 0, spec("text_input", "BYTES")), "p",
                                       body, 16)


def test_token_counts_and_text_of_a_response():
    def out(name, datatype, data, shape=(1,)):
        return OutputTensor(name, datatype, list(shape), data)

    response = InferResponse("m", "1", outputs=[
        out("text_output", "BYTES", datatypes.serialize_bytes([b"ab", b"c"]), (2,)),
        out("num_input_tokens", "UINT32", np.array([4], np.uint32).tobytes()),
        out("num_output_tokens", "INT32", np.array([3], np.int32).tobytes())])
    assert conventions.text_of(response) == "abc"
    assert conventions.token_counts(response) == (4, 3)
    assert conventions.token_counts(InferResponse("m", "1")) == (None, None)


def test_a_value_the_declared_datatype_cannot_hold_is_refused():
    typed = model("python", 0, spec("text_input", "BYTES", (1,), False), spec("seed", "UINT64"),
                  spec("max_tokens", "INT8"), spec("temperature", "FP16"))
    body = parse(CompletionRequest, b'{"model": "m", "prompt": "p", "seed": -1}')
    with pytest.raises(RouteError, match="cannot take 'seed' = -1 as UINT64"):
        conventions.generation_request(typed, "p", body, 16)
    body = parse(CompletionRequest, b'{"model": "m", "prompt": "p", "max_tokens": 300}')
    with pytest.raises(RouteError, match="cannot take 'max_tokens' = 300 as INT8"):
        conventions.generation_request(typed, "p", body, 16)
    body = parse(CompletionRequest, b'{"model": "m", "prompt": "p", "temperature": 0.5}')
    request, _ = conventions.generation_request(typed, "p", body, 16)
    assert inputs_of(request)["temperature"] == ("FP16", [1], [0.5])


def test_a_template_whose_expression_fails_says_so(tmp_path):
    write(tmp_path, "tokenizer_config.json",
          json.dumps({"chat_template": "{{ messages[0]['content'] + 1 }}"}))
    with pytest.raises(chat_templates.ChatTemplateError, match="failed"):
        chat_templates.load(str(tmp_path)).render([{"role": "user", "content": "x"}])
