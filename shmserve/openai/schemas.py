"""The OpenAI API's request bodies, as pydantic models: the fields, types, ranges and defaults
of OpenAI's API reference, as Triton's OpenAI frontend accepts them (unknown fields refused).
A body that does not fit gets status 422 and pydantic's errors, in FastAPI's form:
{"detail": [{"type", "loc": ["body", ...], "msg", "input", ...}]}.

Responses are not modelled here: routes.py writes them as plain JSON objects, on every token
of a stream, where building a pydantic object would cost more than the rest of the chunk.
"""

from typing import Annotated, Any, Literal, Optional, Union

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
NonNegative = Annotated[int, Field(ge=0)]


class SchemaError(Exception):
    """A body that is not the request's schema: FastAPI's 422 detail list."""

    def __init__(self, detail: list):
        super().__init__("request body does not fit the schema")
        self.detail = detail


class _Strict(BaseModel):
    # Explicitly refuse fields the API does not have, as Triton's frontend does.
    model_config = ConfigDict(extra="forbid")


class StreamOptions(BaseModel):
    include_usage: Optional[bool] = False


class _Sampling(_Strict):
    """What completions and chat completions share."""

    model: str
    frequency_penalty: Optional[Penalty] = 0
    ignore_eos: Optional[bool] = False
    logit_bias: Optional[dict[str, int]] = None
    max_tokens: Optional[NonNegative] = None
    min_tokens: Optional[NonNegative] = None
    n: Optional[Annotated[int, Field(ge=1, le=128)]] = 1
    presence_penalty: Optional[Penalty] = 0
    seed: Optional[Seed] = None
    stop: Optional[Union[str, list[str]]] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    top_p: Optional[Annotated[float, Field(ge=0.0, le=1.0)]] = 1
    user: Optional[str] = None


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[int], list[list[Any]]]
    best_of: Optional[Annotated[int, Field(ge=0, le=20)]] = 1
    echo: Optional[bool] = False
    logprobs: Optional[Annotated[int, Field(ge=0, le=5)]] = None
    suffix: Optional[str] = None
    temperature: Optional[Annotated[float, Field(ge=0.0, le=2.0)]] = 1


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ImagePart(BaseModel):
    type: Literal["image_url"]
    image_url: dict


ContentPart = Annotated[Union[TextPart, ImagePart], Field(discriminator="type")]


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"]
    function: FunctionCall


class _Said(BaseModel):
    """A message of a participant: its content, and optionally its name."""

    content: Union[str, list[ContentPart]]
    name: Optional[str] = None


class SystemMessage(_Said):
    role: Literal["system"]


class DeveloperMessage(_Said):
    role: Literal["developer"]


class UserMessage(_Said):
    role: Literal["user"]


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: Optional[Union[str, list[ContentPart]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None
    function_call: Optional[FunctionCall] = None


class ToolMessage(BaseModel):
    role: Literal["tool"]
    content: Union[str, list[ContentPart]]
    tool_call_id: str


class FunctionMessage(BaseModel):
    role: Literal["function"]
    content: Optional[str] = None
    name: str


Message = Annotated[Union[SystemMessage, DeveloperMessage, UserMessage, AssistantMessage,
                          ToolMessage, FunctionMessage], Field(discriminator="role")]


class FunctionDefinition(BaseModel):
    name: str
    description: Optional[str] = None
    parameters: Optional[dict] = None
    strict: Optional[bool] = None


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedToolFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedToolFunction


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    logprobs: Optional[bool] = False
    top_logprobs: Optional[Annotated[int, Field(ge=0, le=20)]] = None
    max_completion_tokens: Optional[NonNegative] = None
    response_format: Optional[dict] = None
    temperature: Optional[Annotated[float, Field(ge=0.0, le=2.0)]] = 0.7
    tools: Optional[list[Tool]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"], NamedToolChoice]] = None
    parallel_tool_calls: Optional[bool] = None
    function_call: Optional[Union[Literal["none", "auto"], NamedToolFunction]] = None
    functions: Optional[list[FunctionDefinition]] = None


class EmbeddingRequest(_Strict):
    model: str
    input: Union[str, Annotated[list[int], Field(min_length=1)]]
    dimensions: Optional[int] = None
    encoding_format: Optional[Literal["float", "base64"]] = "float"
    user: Optional[str] = None


def parse(schema: type[BaseModel], body: bytes) -> Any:
    """The body as `schema`, or SchemaError with FastAPI's detail list: JSON that does not
    parse gets one `json_invalid` error at its position, as FastAPI reports it."""
    try:
        document = orjson.loads(body) if body else None
    except orjson.JSONDecodeError as exc:
        raise SchemaError([{"type": "json_invalid", "loc": ["body", exc.pos],
                            "msg": "JSON decode error", "input": {},
                            "ctx": {"error": exc.msg}}]) from None
    if document is None and not body:
        raise SchemaError([{"type": "missing", "loc": ["body"], "msg": "Field required",
                            "input": None}])
    try:
        # from_attributes: a body that is not an object gets FastAPI's "valid dictionary or
        # object to extract fields from".
        return schema.model_validate(document, from_attributes=True)
    except ValidationError as exc:
        raise SchemaError([_fastapi_error(e) for e in exc.errors(include_url=False)]) from None


def _fastapi_error(error: Any) -> dict:
    out = {"type": error["type"], "loc": ["body", *error["loc"]], "msg": error["msg"],
           "input": error.get("input")}
    ctx = error.get("ctx")
    if ctx:
        # Values such as the exception a validator raised are not JSON: FastAPI writes them
        # as text.
        out["ctx"] = {k: v if isinstance(v, (str, int, float, bool, type(None))) else str(v)
                      for k, v in ctx.items()}
    return out
