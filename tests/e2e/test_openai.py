"""The OpenAI routes against a real server: the official `openai` client (sync, async,
streaming), raw HTTP for the server-sent events' framing and for the errors' statuses and
bodies, as Triton's OpenAI frontend answers them.

Models: tests/models/openai_echo (decoupled; echoes its prompt word by word, reports the
inputs it was sent; its tokenizer/ folder's chat template is the last message's content),
tests/models/openai_embed (the embedding convention) and the bundled textgen.
"""

import asyncio
import base64
import json
import os
import time

import httpx
import numpy as np
import openai
import pytest

from tests.conftest import ROOT, free_port, metric_samples, start_server, stop_server


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused",
                       max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as c:
        yield c


def sse_events(response: httpx.Response) -> list:
    """The `data:` payloads of a server-sent event stream, checking its framing."""
    assert response.headers["content-type"].startswith("text/event-stream")
    body = response.read().decode()
    assert body.endswith("\n\n")
    events = body[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), body
    return [e[len("data: "):] for e in events]


# --- models ------------------------------------------------------------------------------

def test_models_lists_the_loaded_models(client):
    models = {m.id: m for m in client.models.list()}
    assert {"openai_echo", "textgen", "add_sub"} <= set(models)
    echo = models["openai_echo"]
    assert echo.object == "model" and echo.owned_by == "Triton Inference Server"
    assert client.models.retrieve("openai_echo").id == "openai_echo"


def test_an_unknown_model_is_404_with_its_name(client, http):
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no_such_model")
    response = http.get("/v1/models/no_such_model")
    assert response.status_code == 404
    assert response.json() == {"detail": "Unknown model: no_such_model"}


def test_load_and_unload_need_explicit_model_control(http):
    for action in ("load", "unload"):
        response = http.post(f"/v1/models/openai_echo/{action}")
        assert (response.status_code, response.json()) == (
            400, {"detail": "Model load/unload requires --model-control-mode=explicit"})


# --- completions -----------------------------------------------------------------------

PROMPT = "the quick brown fox jumps"


def test_completion_echoes_with_token_counts(client):
    completion = client.completions.create(model="openai_echo", prompt=PROMPT)
    assert completion.object == "text_completion" and completion.model == "openai_echo"
    assert completion.id.startswith("cmpl-")
    (choice,) = completion.choices
    assert choice.text == PROMPT and choice.finish_reason == "stop" and choice.index == 0
    usage = completion.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (5, 5, 10)


def test_streamed_completion_is_one_chunk_a_response_and_joins_to_the_whole(client):
    chunks = list(client.completions.create(model="openai_echo", prompt=PROMPT, stream=True,
                                            stream_options={"include_usage": True}))
    *text_chunks, usage_chunk = chunks
    assert len(text_chunks) == 5
    assert "".join(c.choices[0].text for c in text_chunks) == PROMPT
    assert [c.choices[0].finish_reason for c in text_chunks] == [None] * 4 + ["stop"]
    assert len({c.id for c in chunks}) == 1
    assert usage_chunk.choices == []
    assert usage_chunk.usage.prompt_tokens == 5 and usage_chunk.usage.completion_tokens == 5


def test_a_model_gets_only_the_inputs_it_declares_with_its_datatypes(client):
    # openai_echo has no top_p, seed, stop_words or penalties; max_tokens is INT64 there.
    sent = json.loads(client.completions.create(model="openai_echo", prompt="inputs?",
                                                top_p=0.5, seed=3).choices[0].text)
    assert sent == {"max_tokens": 16, "return_num_input_tokens": True,
                    "return_num_output_tokens": True, "stream": False, "temperature": 1.0}
    sent = json.loads(client.chat.completions.create(
        model="openai_echo", messages=[{"role": "user", "content": "inputs?"}],
        max_completion_tokens=7).choices[0].message.content)
    assert sent["max_tokens"] == 7 and sent["temperature"] == pytest.approx(0.7)


def test_echo_without_an_echo_input_prepends_the_prompt(client):
    completion = client.completions.create(model="openai_echo", prompt="a b", echo=True)
    assert completion.choices[0].text == "a ba b"
    chunks = list(client.completions.create(model="openai_echo", prompt="a b", echo=True,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "a ba b"


def test_stop_sequences_for_a_model_without_them_are_refused(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="openai_echo", prompt="x", stop=["y"])
    assert refused.value.body == {"detail": "model 'openai_echo' takes no stop sequences (it "
                                            "has no input 'stop_words' or 'stop')"}


def test_async_client_streams(server):
    async def run():
        async with openai.AsyncOpenAI(base_url=f"http://{server.http_url}/v1",
                                      api_key="unused", max_retries=0) as aclient:
            async def one(i):
                stream = await aclient.completions.create(model="openai_echo",
                                                          prompt=f"{i} and {i}", stream=True)
                return "".join([c.choices[0].text async for c in stream])
            return await asyncio.gather(*(one(i) for i in range(8)))

    assert asyncio.run(run()) == [f"{i} and {i}" for i in range(8)]


# --- chat --------------------------------------------------------------------------------

def test_chat_renders_the_models_own_template(client):
    messages = [{"role": "system", "content": "ignored"},
                {"role": "user", "content": "hello there"}]
    chat = client.chat.completions.create(model="openai_echo", messages=messages)
    assert chat.object == "chat.completion"
    message = chat.choices[0].message
    assert message.role == "assistant" and message.content == "hello there"
    assert chat.choices[0].finish_reason == "stop"
    assert chat.usage.prompt_tokens == 2


def test_streamed_chat_opens_with_the_role_and_ends_with_the_reason(client):
    chunks = list(client.chat.completions.create(
        model="openai_echo", messages=[{"role": "user", "content": "one two three"}],
        stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    first, *content, usage = chunks
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    assert "".join(c.choices[0].delta.content for c in content) == "one two three"
    assert [c.choices[0].finish_reason for c in content] == [None, None, "stop"]
    assert usage.usage.completion_tokens == 3


def test_chat_without_a_tokenizer_is_triton_s_500(http):
    response = http.post("/v1/chat/completions", json={
        "model": "add_sub", "messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 500 and response.json() == {"detail": "Unknown tokenizer"}


def test_a_template_that_raises_is_400(http):
    response = http.post("/v1/chat/completions", json={
        "model": "openai_echo", "messages": [{"role": "user", "content": "raise"}]})
    assert response.status_code == 400 and "the template refuses" in response.json()["detail"]


def test_textgen_streams_what_it_answers_whole(client):
    """The bundled model end to end: greedy, so the streamed text equals the whole one."""
    args = dict(model="textgen", prompt="We hold these truths", max_tokens=24, temperature=0)
    whole = client.completions.create(**args)
    streamed = list(client.completions.create(**args, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text
    assert whole.usage.completion_tokens == len(whole.choices[0].text) == 24
    assert whole.usage.prompt_tokens == len("We hold these truths")
    chat = client.chat.completions.create(
        model="textgen_iterative", messages=[{"role": "user", "content": "When in the"}],
        max_tokens=12, temperature=0)
    assert len(chat.choices[0].message.content) == 12
    assert chat.usage.prompt_tokens == len("User: When in the\nAssistant:")


# --- embeddings --------------------------------------------------------------------------

def test_embeddings_float_and_base64(client):
    result = client.embeddings.create(model="openai_embed", input="an apple a day")
    assert result.object == "list" and result.model == "openai_embed"
    assert result.data[0].embedding == [14.0, 4.0, 5.0, 0.5]
    assert result.usage.prompt_tokens == 4
    raw = client.embeddings.with_raw_response.create(model="openai_embed", input="abc",
                                                     encoding_format="base64")
    encoded = json.loads(raw.text)["data"][0]["embedding"]
    assert np.frombuffer(base64.b64decode(encoded), np.float32).tolist() == [3, 1, 1, 0.5]


def test_embeddings_of_a_generation_model_is_triton_s_400(http):
    response = http.post("/v1/embeddings", json={"model": "textgen", "input": "x"})
    assert response.status_code == 400
    assert response.json() == {
        "detail": "TRT-LLM backend and Python backend do not support embedding requests"}


# --- server-sent events, errors ----------------------------------------------------------

def test_sse_framing_on_the_wire(http):
    with http.stream("POST", "/v1/completions", json={
            "model": "openai_echo", "prompt": "a b c", "stream": True}) as response:
        assert response.status_code == 200
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    assert [json.loads(e)["choices"][0]["text"] for e in events[:-1]] == ["a ", "b ", "c"]


@pytest.mark.parametrize("body, status, detail", [
    (b"{not json", 422, "json_invalid"),
    (b"[]", 422, "model_attributes_type"),
    (b'{"model": "openai_echo"}', 422, "missing"),
    (b'{"model": "openai_echo", "prompt": "x", "max_tokens": "many"}', 422, "int_parsing"),
    (b'{"model": "openai_echo", "prompt": "x", "temperature": 3}', 422, "less_than_equal"),
    (b'{"model": "openai_echo", "prompt": "x", "colour": 1}', 422, "extra_forbidden"),
    (b'{"model": "nope", "prompt": "x"}', 400, "Unknown model: nope"),
    (b'{"model": "openai_echo", "prompt": "x", "n": 2}', 400,
     "Received n=2, but only single choice (n=1) is currently supported"),
    (b'{"model": "openai_echo", "prompt": ["a", "b"]}', 400,
     "only single string input is supported"),
    (b'{"model": "openai_echo", "prompt": ""}', 400, "prompt must be non-empty"),
    (b'{"model": "openai_echo", "prompt": "x", "suffix": "y"}', 400,
     "suffix is not currently supported"),
    (b'{"model": "openai_echo", "prompt": "x", "logit_bias": {"1": 2}}', 400,
     "logit bias is not supported"),
    (b'{"model": "openai_echo", "prompt": "x", "stream_options": {"include_usage": true}}',
     400, "`stream_options` can only be used when `stream` is True"),
    (b'{"model": "add_sub", "prompt": "x"}', 400,
     "model 'add_sub' has no input 'text_input': it does not generate text"),
    (b'{"model": "openai_echo", "prompt": "fail"}', 400, "the echo model was asked to fail"),
    (b'{"model": "openai_echo", "prompt": "fail", "stream": true}', 400,
     "the echo model was asked to fail"),
])
def test_bad_requests_get_a_clear_4xx(http, body, status, detail):
    response = http.post("/v1/completions", content=body,
                         headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    got = response.json()["detail"]
    if isinstance(got, list):
        assert got[0]["type"] == detail and got[0]["loc"][0] == "body"
    else:
        assert got == detail
    assert http.get("/v2/health/live").status_code == 200


def test_large_and_deep_bodies_are_served_or_refused_clearly(http):
    prompt = "word " * 300_000  # parsed off the event loop
    response = http.post("/v1/completions", json={"model": "openai_echo", "prompt": prompt})
    assert response.json()["choices"][0]["text"] == prompt
    deep = b'{"model": "openai_echo", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    response = http.post("/v1/completions", content=deep)
    assert response.status_code == 422 and response.json()["detail"][0]["type"] == \
        "json_invalid"
    assert http.get("/v2/health/live").status_code == 200


def test_chat_refusals_use_triton_s_words(http):
    def chat(**fields):
        body = {"model": "openai_echo", "messages": [{"role": "user", "content": "x"}],
                **fields}
        return http.post("/v1/chat/completions", json=body)

    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    cases = [({"tools": [tool]}, "having tools in the request requires --tool-call-parser to "
                                 "be set"),
             ({"tool_choice": "auto", "tools": [tool]},
              '"auto" tool choice requires --tool-call-parser to be set'),
             ({"tool_choice": "required"},
              '"required" tool choice requires CreateChatCompletionRequest.tools to be '
              'provided'),
             ({"logprobs": True}, "logprobs are currently available only for the vLLM backend"),
             ({"messages": [{"role": "user", "content": [
                 {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
              "only text message is supported, but got image_url")]
    for fields, detail in cases:
        response = chat(**fields)
        assert (response.status_code, response.json()) == (400, {"detail": detail})
    assert chat(messages=[]).status_code == 422


def test_an_error_after_the_stream_began_is_an_event(http):
    with http.stream("POST", "/v1/completions", json={
            "model": "openai_echo", "prompt": "fail later", "stream": True}) as response:
        events = sse_events(response)
    assert json.loads(events[0])["choices"][0]["text"] == "first "
    error = json.loads(events[1])["error"]
    assert error["message"] == "the echo model was asked to fail" and error["code"] == 400
    assert events[-1] == "[DONE]"


def test_a_client_that_leaves_cancels_the_request_in_the_model(http, tmp_path):
    record = tmp_path / "seen"
    with http.stream("POST", "/v1/chat/completions", json={
            "model": "openai_echo", "stream": True,
            "messages": [{"role": "user", "content": f"record {record}"}]}) as response:
        lines = response.iter_lines()
        for _ in range(3):
            next(lines)
    deadline = time.monotonic() + 10
    while not record.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert record.read_text() == "cancelled"


def test_the_routes_count_in_statistics_and_metrics(client, server, http):
    def successes():
        stats = http.get("/v2/models/openai_echo/stats").json()["model_stats"][0]
        return stats["inference_stats"]["success"]["count"]

    before = successes()
    client.completions.create(model="openai_echo", prompt="count me")
    list(client.chat.completions.create(model="openai_echo", stream=True,
                                        messages=[{"role": "user", "content": "me too"}]))
    assert successes() == before + 2
    samples = metric_samples(http.get("/metrics").text)
    key = ("nv_inference_request_success", (("model", "openai_echo"), ("version", "1")))
    assert samples[key] >= 2


# --- the OpenAI port, restrictions, limits -----------------------------------------------

@pytest.fixture(scope="module")
def restricted(test_repository, tmp_path_factory):
    port = free_port()
    log_path = str(tmp_path_factory.mktemp("openai") / "shmserve.log")
    srv = start_server(test_repository, log_path, "--openai-port", str(port),
                       "--openai-restricted-api", "inference,model-repository", "X-Key", "s3",
                       "--tokenizer", os.path.join(ROOT, "model_repository", "textgen",
                                                   "tokenizer"),
                       "--http-max-input-size", "4096",
                       "--model-control-mode", "explicit", "--load-model", "openai_echo",
                       "--load-model", "add_sub", wait_models=("openai_echo",))
    yield srv, port
    stop_server(srv)


def test_openai_port_serves_the_routes_with_fastapi_s_bodies(restricted):
    srv, port = restricted
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
        assert c.get("/health/ready").status_code == 200
        assert "nv_inference_request_success" in c.get("/metrics").text
        assert (c.get("/v2/health/ready").status_code, c.get("/nope").json()) == \
            (404, {"detail": "Not Found"})
        assert c.delete("/v1/models").json() == {"detail": "Method Not Allowed"}
        models = c.get("/v1/models", headers={"X-Key": "s3"}).json()
        assert [m["id"] for m in models["data"]] == ["add_sub", "openai_echo"]


def test_restricted_groups_get_401_without_the_header(restricted):
    srv, port = restricted
    for base in (f"http://127.0.0.1:{port}", f"http://{srv.http_url}"):
        with httpx.Client(base_url=base, timeout=30) as c:
            body = {"model": "openai_echo", "prompt": "hi"}
            refused = c.post("/v1/completions", json=body)
            assert refused.status_code == 401
            assert refused.json() == {"error": {
                "message": "This API is restricted, expecting header 'X-Key' with valid value",
                "type": "authentication_error", "code": "invalid_auth"}}
            assert c.get("/v1/models", headers={"X-Key": "wrong"}).status_code == 401
            ok = c.post("/v1/completions", json=body, headers={"x-key": "s3"})
            assert ok.json()["choices"][0]["text"] == "hi"
            assert c.get("/health/ready").status_code == 200  # not restricted


def test_the_server_tokenizer_serves_models_without_their_own(restricted):
    srv, port = restricted
    # add_sub has no tokenizer folder: --tokenizer's template renders, then the model has no
    # text input.
    response = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                          headers={"X-Key": "s3"},
                          json={"model": "add_sub", "messages": [{"role": "user",
                                                                  "content": "x"}]})
    assert response.status_code == 400 and "has no input 'text_input'" in response.text


def test_a_body_over_the_limit_is_413_on_the_routes_and_triton_s_400_elsewhere(restricted):
    srv, port = restricted
    big = b'{"model": "openai_echo", "prompt": "' + b"x" * 5000 + b'"}'
    for base in (f"http://127.0.0.1:{port}", f"http://{srv.http_url}"):
        response = httpx.post(base + "/v1/completions", content=big, headers={"X-Key": "s3"})
        assert response.status_code == 413
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "content_too_large"
        assert error["message"].startswith(f"Request size of {len(big)} bytes exceeds the "
                                           f"maximum allowed input size of 4096 bytes.")
    response = httpx.post(f"http://{srv.http_url}/v2/models/add_sub/infer", content=big)
    assert response.status_code == 400 and "error" in response.json()
