"""Calls into the server, through the channel the worker installs (context.py): the call BLS
requests and model control go through, and the model-control API."""

from workers.model_api.context import CONTEXT
from workers.model_api.errors import TritonModelException


def _server_call(kind: str, args: dict, blocks=()):
    calls = CONTEXT.server_calls
    if calls is None:
        raise TritonModelException("calls into the server work only inside a shmserve worker")
    return calls.call(kind, args, blocks)


def _control(kind: str, args: dict):
    """A model-control call's answer; its error raised as TritonModelException."""
    replies = _server_call(kind, args)
    try:
        reply = next(replies)
    finally:
        replies.close()
    if reply.response is not None and reply.response.error is not None:
        raise TritonModelException(reply.response.error[1])
    return reply.value


def load_model(model_name, config="", files=None):
    """Load (or reload) a model of the repository, as the repository load API does: `config`
    a model configuration JSON string, `files` {"file:<version>/<name>": bytes}."""
    files = dict(files or {})
    for key, value in files.items():
        if not isinstance(key, str) or not key.startswith("file:"):
            raise TritonModelException(f"file keys must start with 'file:', got {key!r}")
        if not isinstance(value, (bytes, bytearray)):
            raise TritonModelException(f"the content of '{key}' must be bytes")
    _control("load", {"model": model_name, "config": config or "", "files": files})


def unload_model(model_name, unload_dependents=False):
    _control("unload", {"model": model_name, "unload_dependents": bool(unload_dependents)})


def is_model_ready(model_name, model_version=""):
    return bool(_control("ready", {"model": model_name, "version": str(model_version)}))
