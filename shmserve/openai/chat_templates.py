"""Chat messages -> a prompt, by the chat template of a Hugging Face tokenizer folder.

A tokenizer folder keeps its template in tokenizer_config.json ("chat_template": a string, or
a list of {"name", "template"}), or beside it in chat_template.jinja or chat_template.json;
--chat-template FILE replaces it. The template is rendered as the `transformers` library
renders it (apply_chat_template with tokenize=False, which is all Triton's frontend asks of
its tokenizer): Jinja2 in a sandbox, blocks trimmed, loop controls, `raise_exception`,
`strftime_now` and a `tojson` that keeps non-ASCII text, with `messages`, `tools`,
`add_generation_prompt` and the folder's special tokens. transformers itself is not
imported: it would bring torch into the front process, seconds of start-up and hundreds of
megabytes, for a Jinja2 render.
"""

import datetime
import json
import os

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                   "cls_token", "mask_token")


class ChatTemplateError(Exception):
    """A template that cannot render these messages (its own raise_exception included)."""


class ChatTemplate:
    def __init__(self, source: str, tool_source: str | None, special_tokens: dict, origin: str):
        self.origin = origin
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = _strftime_now
        self._template = env.from_string(source)
        self._tool_template = env.from_string(tool_source) if tool_source else None
        self._special = special_tokens

    def render(self, messages: list, tools: list | None = None,
               add_generation_prompt: bool = True) -> str:
        template = self._template
        if tools and self._tool_template is not None:
            template = self._tool_template
        try:
            return template.render(messages=messages, tools=tools,
                                   add_generation_prompt=add_generation_prompt,
                                   **self._special)
        except (TemplateError, ArithmeticError, LookupError, TypeError, ValueError,
                AttributeError) as exc:  # what a template's own expressions may raise
            raise ChatTemplateError(f"the chat template of {self.origin} failed: {exc}") from None


def load(folder: str, template_file: str | None = None) -> ChatTemplate | None:
    """The chat template of tokenizer folder `folder` (or of `template_file`, with the
    folder's special tokens); None when neither has one. Raises OSError/ValueError for a
    folder or file that cannot be read."""
    config = _json_file(os.path.join(folder, "tokenizer_config.json")) if folder else {}
    special = {name: _token_text(config.get(name)) for name in _SPECIAL_TOKENS}
    if template_file:
        with open(template_file, encoding="utf-8") as f:
            return ChatTemplate(f.read(), None, special, template_file)
    if not folder:
        return None
    source, tool_source = _templates(config.get("chat_template"))
    if source is None:
        jinja = os.path.join(folder, "chat_template.jinja")
        if os.path.isfile(jinja):
            with open(jinja, encoding="utf-8") as f:
                source = f.read()
        else:
            side = os.path.join(folder, "chat_template.json")
            if os.path.isfile(side):
                source, tool_source = _templates(_json_file(side).get("chat_template"))
    if source is None:
        return None
    return ChatTemplate(source, tool_source, special, folder)


def _templates(value) -> tuple:
    """(default template, tool-use template) from a "chat_template" value."""
    if isinstance(value, str):
        return value, None
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named.get("default"), named.get("tool_use")
    return None, None


def _json_file(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        value = json.load(f)
    if not isinstance(value, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return value


def _token_text(token) -> str | None:
    if isinstance(token, dict):  # an AddedToken as saved: {"content": ..., ...}
        token = token.get("content")
    return token if isinstance(token, str) else None


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise(message):
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)
