"""The chat request's messages and tools as a chat template reads them: plain dicts, text
content kept as given (a string, or a list of {"type": "text", "text"} parts), an assistant's
tool-call arguments parsed from their JSON text into objects, as templates expect them."""

import json

from shmserve.openai.conventions import RouteError
from shmserve.openai.schemas import ChatCompletionRequest, TextPart


def conversation(body: ChatCompletionRequest) -> list[dict]:
    out = []
    for message in body.messages:
        content = message.content
        entry: dict = {"role": message.role}
        if content is None or isinstance(content, str):
            entry["content"] = content
        else:
            parts = []
            for part in content:
                if not isinstance(part, TextPart):  # Triton's frontend's words
                    raise RouteError(400, f"only text message is supported, but got "
                                          f"{part.type}")
                parts.append({"type": "text", "text": part.text})
            entry["content"] = parts
        calls = getattr(message, "tool_calls", None)
        if calls:
            entry["tool_calls"] = [_tool_call(call) for call in calls]
        if message.role == "tool":
            entry["tool_call_id"] = message.tool_call_id
        name = getattr(message, "name", None)
        if message.role == "user" and isinstance(name, str):
            entry["name"] = name
        out.append(entry)
    return out


def tools(body: ChatCompletionRequest) -> list[dict] | None:
    return None if body.tools is None else [tool.model_dump() for tool in body.tools]


def _tool_call(call) -> dict:
    try:
        arguments = json.loads(call.function.arguments)
    except ValueError:
        raise RouteError(400, f"the arguments of tool call '{call.id}' are not JSON") from None
    return {"id": call.id, "type": call.type,
            "function": {"name": call.function.name, "arguments": arguments}}
