"""The options the routes refuse, with Triton's OpenAI frontend's words and status 400:
what a schema cannot say (a combination of fields, or what the model or server lacks)."""

from shmserve.openai.conventions import RouteError, TextModel
from shmserve.openai.schemas import ChatCompletionRequest, CompletionRequest

# Triton's frontend serves logprobs for vLLM models only; shmserve not yet for any.
_NO_LOGPROBS = "logprobs are currently available only for the vLLM backend"
_NO_LOGPROBS_HERE = "logprobs are not supported by this server"


def check_completion(body: CompletionRequest, model: TextModel) -> None:
    if body.suffix is not None:
        _refuse("suffix is not currently supported")
    if not body.prompt:
        _refuse("prompt must be non-empty")
    if not isinstance(body.prompt, str):
        _refuse("only single string input is supported")
    if "best_of" in body.model_fields_set and model.vllm:
        _refuse("best_of is no longer supported in vLLM backend, removed from vLLM V1 engine")
    if body.n and body.n > 1:
        _refuse(f"Received n={body.n}, but only single choice (n=1) is currently supported")
    if body.best_of and body.best_of > 1:
        _refuse(f"Received best_of={body.best_of}, but only single choice (best_of=1) is "
                f"currently supported")
    if body.logit_bias is not None:
        _refuse("logit bias is not supported")
    if body.logprobs is not None and body.logprobs > 0:
        _refuse(_NO_LOGPROBS_HERE if model.vllm else _NO_LOGPROBS)
    _check_stream_options(body)


def check_chat(body: ChatCompletionRequest, model: TextModel) -> None:
    if body.n and body.n > 1:
        _refuse(f"Received n={body.n}, but only single choice (n=1) is currently supported")
    if body.logit_bias is not None:
        _refuse("logit bias is not currently supported")
    if body.logprobs or body.top_logprobs is not None:
        if not model.vllm:
            _refuse(_NO_LOGPROBS)
        if not body.logprobs:
            _refuse("`top_logprobs` can only be used when `logprobs` is True")
        _refuse(_NO_LOGPROBS_HERE)
    _check_tools(body)
    _check_stream_options(body)


def _check_tools(body: ChatCompletionRequest) -> None:
    choice = body.tool_choice
    named = choice is not None and not isinstance(choice, str)
    if choice == "required" and not body.tools:
        _refuse('"required" tool choice requires CreateChatCompletionRequest.tools to be '
                'provided')
    if named and not body.tools:
        _refuse("Named tool choice requires CreateChatCompletionRequest.tools to be provided")
    # Triton's frontend answers these with a tool-call parser or guided decoding, which this
    # server does not have.
    if choice == "auto":
        _refuse('"auto" tool choice requires --tool-call-parser to be set')
    if choice is None and body.tools:
        _refuse("having tools in the request requires --tool-call-parser to be set")
    if choice == "required" or named:
        _refuse("tool_choice 'required' or a named tool needs guided decoding, which this "
                "server does not support: use tool_choice 'none'")


def _check_stream_options(body) -> None:
    if body.stream_options and not body.stream:
        _refuse("`stream_options` can only be used when `stream` is True")


def _refuse(detail: str):
    raise RouteError(400, detail)
