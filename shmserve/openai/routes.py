"""The OpenAI routes' handlers: decode the body (schemas.py), refuse what cannot be served
(checks.py), build the model's request (conventions.py), run it through the dataplane like
any other inference (statistics, metrics, cancellation and backpressure as for
generate_stream), and answer in the OpenAI API's JSON, or as server-sent events ending with
`data: [DONE]`.

Errors have FastAPI's body {"detail": ...}, as Triton's frontend answers them: 422 for a body
that does not fit the schema, 400 for an option that cannot be served or an unknown model,
404 for an unknown model's /v1/models entry, and the status of the dataplane's error code for
a request the server or the model refuses (a model's INVALID_ARG is 400). An error after a
stream began arrives as an event `data: {"error": {...}}` before `data: [DONE]`.
"""

import asyncio
import contextlib
import os
import time
import uuid
from dataclasses import dataclass, field

import orjson
from jinja2 import TemplateError

from shmserve.dataplane import DataPlane
from shmserve.errors import Code, ServerError
from shmserve.http.http1_messages import Request, Response
from shmserve.openai import chat_messages, chat_templates, checks, conventions
from shmserve.openai.conventions import RouteError, TextModel
from shmserve.openai.schemas import (ChatCompletionRequest, CompletionRequest, EmbeddingRequest,
                                     SchemaError, parse)

OWNED_BY = "Triton Inference Server"  # what Triton's frontend says owns every model
DEFAULT_MAX_TOKENS = 16  # Triton's frontend's --default-max-tokens
TOKENIZER_FOLDER = "tokenizer"  # a model directory's own tokenizer folder

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_DONE = b"data: [DONE]\n\n"

# Bodies above this are parsed, and their chat rendered, in a thread, so that the event loop
# keeps serving the other clients meanwhile.
_OFF_LOOP_BYTES = 256 * 1024

_STATUS = {Code.INVALID_ARG: 400, Code.NOT_FOUND: 404, Code.UNAVAILABLE: 503,
           Code.UNSUPPORTED: 400, Code.ALREADY_EXISTS: 400, Code.CANCELLED: 400,
           Code.UNKNOWN: 400, Code.INTERNAL: 500}


@dataclass
class OpenAISettings:
    tokenizer: str | None = None  # --tokenizer: a Hugging Face tokenizer folder
    chat_template: str | None = None  # --chat-template: a Jinja file replacing its template
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    restrictions: dict = field(default_factory=dict)  # restrictions.parse's


def detail_response(status: int, detail) -> Response:
    return Response(status, orjson.dumps({"detail": detail}), "application/json")


class OpenAIRoutes:
    def __init__(self, dataplane: DataPlane, settings: OpenAISettings, metrics_text=None):
        """`metrics_text`: an async callable giving the metrics port's Prometheus text, or
        None when metrics are off."""
        self.dp = dataplane
        self.settings = settings
        self.metrics_text = metrics_text
        self._created: dict = {}  # model name -> when these routes first listed it
        # Chat templates by model name; loaded on first use, so a bad tokenizer folder fails
        # the requests that need it, not the server.
        self._templates: dict = {}
        self._server_template = None
        if settings.tokenizer or settings.chat_template:
            self._server_template = chat_templates.load(settings.tokenizer or "",
                                                        settings.chat_template)

    def routes(self) -> list:
        """(method, path pattern, handler, restriction group) of every route."""
        out = [("GET", "/v1/models", self.list_models, "model-repository"),
               ("GET", "/v1/models/{model}", self.get_model, "model-repository"),
               ("POST", "/v1/models/{model}/load", self.load_model, "model-repository"),
               ("POST", "/v1/models/{model}/unload", self.unload_model, "model-repository"),
               ("POST", "/v1/completions", self.completions, "inference"),
               ("POST", "/v1/chat/completions", self.chat_completions, "inference"),
               ("POST", "/v1/embeddings", self.embeddings, "inference"),
               ("GET", "/health/ready", self.ready, "health")]
        if self.metrics_text is not None:
            out.append(("GET", "/metrics", self.metrics, "metrics"))
        return out

    # --- utilities -------------------------------------------------------------------------

    async def ready(self, request: Request) -> Response:
        if not self.dp.server_ready():
            return detail_response(400, "Attached inference engine is not ready for inference "
                                        "requests.")
        return Response(200)

    async def metrics(self, request: Request) -> Response:
        return Response(200, await self.metrics_text(), "text/plain; charset=utf-8")

    # --- models ----------------------------------------------------------------------------

    async def list_models(self, request: Request) -> Response:
        data = [self._model_entry(name) for name in self._ready_models()]
        return _json({"object": "list", "data": data})

    async def get_model(self, request: Request) -> Response:
        name = request.match_info["model"]
        if name not in self._ready_models():
            return detail_response(404, f"Unknown model: {name}")
        return _json(self._model_entry(name))

    async def load_model(self, request: Request) -> Response:
        """Triton's frontend's load: explicit model control only, a model not serving yet;
        answers once it is ready (its entry) or why not."""
        name = request.match_info["model"]
        refused = self._model_control_refusal()
        if refused is not None:
            return refused
        if name in self._ready_models():
            return detail_response(400, f"Model '{name}' is already loaded")
        failed = await self._control("load", name, self.dp.load_model(name))
        if failed is not None:
            return failed
        self._created[name] = int(time.time())
        return _json(self._model_entry(name))

    async def unload_model(self, request: Request) -> Response:
        """Triton's frontend's unload: explicit model control only, a serving model."""
        name = request.match_info["model"]
        refused = self._model_control_refusal()
        if refused is not None:
            return refused
        if name not in self._ready_models():
            return detail_response(400, f"Unknown model: {name}")
        failed = await self._control("unload", name, self.dp.unload_model(name))
        if failed is not None:
            return failed
        self._created.pop(name, None)
        return _json({"status": "success", "model": name})

    @staticmethod
    async def _control(action: str, name: str, call) -> Response | None:
        """None once `call` (a load or an unload) is done; else why not, as Triton's frontend
        says it: the client's mistake (INVALID_ARG) 400, anything else 500."""
        try:
            await call
        except ServerError as exc:
            return detail_response(400 if exc.code == Code.INVALID_ARG else 500,
                                   f"Failed to {action} model '{name}': {exc.message}")
        return None

    def _model_control_refusal(self) -> Response | None:
        if self.dp.model_control_mode() != "explicit":
            return detail_response(400, "Model load/unload requires "
                                        "--model-control-mode=explicit")
        return None

    def _ready_models(self) -> list:
        """The models with a ready version, from the registry (no scan of the repository)."""
        return list(dict.fromkeys(mv.name for mv, _ in self.dp.model_statistics()))

    def _model_entry(self, name: str) -> dict:
        created = self._created.setdefault(name, int(time.time()))
        return {"id": name, "created": created, "object": "model", "owned_by": OWNED_BY}

    def _text_model(self, name: str) -> TextModel:
        try:
            config, _ = self.dp.model_config(name)
            backend = config.backend or ("ensemble" if config.platform == "ensemble" else "")
            return TextModel(name, backend, self.dp.signature(name), self.dp.is_decoupled(name))
        except ServerError as exc:
            if exc.code in (Code.NOT_FOUND, Code.UNAVAILABLE):
                raise RouteError(400, f"Unknown model: {name}") from None
            raise

    def _chat_template(self, name: str):
        """The model's own tokenizer folder's template, else the server's (--tokenizer,
        --chat-template); read once per model name."""
        if name not in self._templates:
            directory = self.dp.model_directory(name)
            folder = os.path.join(directory, TOKENIZER_FOLDER) if directory else ""
            own = None
            if folder and os.path.isdir(folder):
                try:
                    own = chat_templates.load(folder, self.settings.chat_template)
                except (OSError, ValueError, TemplateError) as exc:
                    raise RouteError(500, f"cannot read the tokenizer of model '{name}': "
                                          f"{exc}") from None
            self._templates[name] = own
        return self._templates[name] or self._server_template

    # --- inference ---------------------------------------------------------------------------

    async def completions(self, request: Request) -> Response | None:
        return await self._answering(self._completions, request)

    async def chat_completions(self, request: Request) -> Response | None:
        return await self._answering(self._chat_completions, request)

    async def embeddings(self, request: Request) -> Response | None:
        return await self._answering(self._embeddings, request)

    async def _answering(self, handler, request: Request) -> Response | None:
        try:
            return await handler(request)
        except SchemaError as exc:
            return detail_response(422, exc.detail)
        except RouteError as exc:
            return detail_response(exc.status, exc.detail)
        except ServerError as exc:
            return detail_response(_STATUS.get(exc.code, 400), exc.message)

    async def _completions(self, request: Request):
        body = await _off_loop(request, parse, CompletionRequest, request.body)
        model = self._text_model(body.model)
        checks.check_completion(body, model)
        infer_request, echo = conventions.generation_request(
            model, body.prompt, body, self.settings.default_max_tokens)
        answer = _Completion(body, body.prompt if echo else "")
        return await self._generate(request, infer_request, body, answer)

    async def _chat_completions(self, request: Request):
        body = await _off_loop(request, parse, ChatCompletionRequest, request.body)
        model = self._text_model(body.model)
        template = self._chat_template(model.name)
        if template is None:  # Triton's frontend's answer
            raise RouteError(500, "Unknown tokenizer")
        checks.check_chat(body, model)
        try:
            prompt = await _off_loop(request, template.render,
                                     chat_messages.conversation(body), chat_messages.tools(body))
        except chat_templates.ChatTemplateError as exc:
            raise RouteError(400, str(exc)) from None
        infer_request, _ = conventions.generation_request(
            model, prompt, body, self.settings.default_max_tokens)
        return await self._generate(request, infer_request, body, _Chat(body))

    async def _embeddings(self, request: Request):
        body = await _off_loop(request, parse, EmbeddingRequest, request.body)
        model = self._text_model(body.model)
        infer_request = conventions.embedding_request(model, body)
        vectors: list = []
        usage = await self._run(infer_request, lambda response: vectors.append(
            conventions.embedding_of(model, response)))
        if not vectors:
            raise RouteError(500, f"model '{model.name}' answered no embedding")
        vector = vectors[0]
        if body.dimensions is not None and len(vector) != body.dimensions \
                and not model.takes("dimensions") and not model.vllm:
            raise RouteError(400, f"model '{model.name}' gives embeddings of {len(vector)} "
                                  f"dimensions, not {body.dimensions}")
        embedding = vector
        if body.encoding_format == "base64":
            embedding = _base64_floats(vector)
        return _json({"object": "list",
                      "data": [{"object": "embedding", "embedding": embedding, "index": 0}],
                      "model": body.model, "usage": usage.embedding()})

    async def _generate(self, request: Request, infer_request, body, answer) -> Response | None:
        if not body.stream:
            text: list = []
            usage = await self._run(infer_request,
                                    lambda response: text.append(conventions.text_of(response)))
            return _json(answer.whole("".join(text), usage.completion()))
        self.dp.stream_opened()
        try:
            await self._event_stream(request, infer_request, body, answer)
        finally:
            self.dp.stream_closed()
        return None  # the answer went out as the stream

    async def _run(self, infer_request, take) -> "_Usage":
        """Runs the request to its end, handing each response to `take`; the token counts of
        them all. The first error is raised."""
        usage = _Usage()
        async with contextlib.aclosing(self.dp.stream(infer_request)) as items:
            async for item in items:
                if item.error is not None:
                    raise item.error
                if item.response is not None:
                    try:
                        take(item.response)
                        usage.add(item.response)
                    finally:
                        item.response.done()
        return usage

    async def _event_stream(self, request: Request, infer_request, body, answer) -> None:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        usage = _Usage()
        stream = None
        # Events not yet written: the opening goes out with the first chunk, the last chunk
        # with the usage and [DONE], one write each.
        pending: list = []
        async with contextlib.aclosing(self.dp.stream(infer_request)) as items:
            try:
                async for item in items:
                    if stream is None:
                        if item.error is not None:
                            raise item.error  # before the stream: the request's status
                        stream = request.stream(SSE_HEADERS)
                        pending.extend(answer.opening())
                    if item.error is not None:
                        pending.append(_error_event(item.error))
                        break
                    text = ""
                    if item.response is not None:
                        try:
                            text = conventions.text_of(item.response)
                            usage.add(item.response)
                        finally:
                            item.response.done()
                    elif not item.final:
                        continue
                    pending.append(answer.chunk(text, item.final))
                    if not item.final:
                        await stream.write(b"".join(pending))
                        pending.clear()
            except ServerError as exc:
                if stream is None:
                    raise
                pending.append(_error_event(exc))
        if stream is None:  # no response at all: the request ended without one
            stream = request.stream(SSE_HEADERS)
            pending.extend(answer.opening())
        if include_usage and usage.known:
            pending.append(answer.usage_chunk(usage.completion()))
        pending.append(_DONE)
        await stream.write(b"".join(pending))
        await stream.end()


class _Usage:
    """Token counts summed over a request's responses: the prompt's once, the output's each."""

    def __init__(self):
        self.prompt: int | None = None
        self.output = 0
        self.known = False

    def add(self, response) -> None:
        prompt, output = conventions.token_counts(response)
        if prompt is None:
            return
        if self.prompt is None:
            self.prompt = prompt
        self.known = True
        self.output += output or 0

    def completion(self) -> dict | None:
        if not self.known:
            return None
        return {"completion_tokens": self.output, "prompt_tokens": self.prompt,
                "total_tokens": self.prompt + self.output}

    def embedding(self) -> dict | None:
        if not self.known:
            return None
        return {"prompt_tokens": self.prompt, "total_tokens": self.prompt}


class _Answer:
    """What every object of one answer shares: its id, time and model; `whole_object` and
    `chunk_object` name the API's objects of the whole answer and of a stream's chunks."""

    whole_object = chunk_object = ""

    def __init__(self, body):
        self.id = f"cmpl-{uuid.uuid1()}"
        self.created = int(time.time())
        self.model = body.model

    def _doc(self, obj: str, choices: list, usage) -> dict:
        return {"id": self.id, "choices": choices, "created": self.created, "model": self.model,
                "system_fingerprint": None, "object": obj, "usage": usage}

    def _chunk(self, choice: dict) -> bytes:
        return _event(self._doc(self.chunk_object, [choice], None))

    def usage_chunk(self, usage: dict) -> bytes:
        return _event(self._doc(self.chunk_object, [], usage))


class _Completion(_Answer):
    """/v1/completions' JSON; `echo`: the prompt the answer starts with (echo asked of a model
    that cannot echo)."""

    whole_object = chunk_object = "text_completion"

    def __init__(self, body: CompletionRequest, echo: str):
        super().__init__(body)
        self.echo = echo

    def whole(self, text: str, usage) -> dict:
        return self._doc(self.whole_object, [{"finish_reason": "stop", "index": 0,
                                              "logprobs": None, "text": self.echo + text}],
                         usage)

    def opening(self) -> list:
        return [self.chunk(self.echo, False)] if self.echo else []

    def chunk(self, text: str, final: bool) -> bytes:
        return self._chunk({"finish_reason": "stop" if final else None, "index": 0,
                            "logprobs": None, "text": text})


class _Chat(_Answer):
    """/v1/chat/completions' JSON."""

    whole_object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def whole(self, text: str, usage) -> dict:
        message = {"content": text, "tool_calls": None, "role": "assistant",
                   "function_call": None}
        return self._doc(self.whole_object, [{"index": 0, "message": message, "logprobs": None,
                                              "finish_reason": "stop"}], usage)

    def opening(self) -> list:
        # The first chunk names the role and has no content.
        return [self._delta({"role": "assistant", "content": "", "function_call": None}, None)]

    def chunk(self, text: str, final: bool) -> bytes:
        return self._delta({"role": None, "content": text, "function_call": None},
                           "stop" if final else None)

    def _delta(self, delta: dict, finish) -> bytes:
        return self._chunk({"index": 0, "delta": delta, "logprobs": None,
                            "finish_reason": finish})


async def _off_loop(request: Request, fn, *args):
    if len(request.body) < _OFF_LOOP_BYTES:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)


def _event(doc: dict) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def _error_event(exc: ServerError) -> bytes:
    status = _STATUS.get(exc.code, 400)
    kind = "invalid_request_error" if status < 500 else "internal_error"
    return _event({"error": {"message": exc.message, "type": kind, "code": status}})


def _json(doc: dict) -> Response:
    return Response(200, orjson.dumps(doc), "application/json")


def _base64_floats(vector: list) -> str:
    import base64

    import numpy as np

    return base64.b64encode(np.asarray(vector, dtype=np.float32).tobytes()).decode("ascii")
