"""A model's own chat template, rendered the way llama.cpp and transformers render it.

Primitives:
- ``ChatMessage(role, content)``: one message (pydantic; ``role`` one of system, user,
  assistant, tool; ``content`` a string).
- ``messages_of(messages) -> list[ChatMessage]``: validated (a typed error naming the message).
- ``render_chat(source, messages, add_generation_prompt=True) -> str``: the template of a
  ``ChatTemplateSource`` rendered in a sandboxed Jinja2 environment (trim_blocks, lstrip_blocks,
  loop controls, ``raise_exception``, ``strftime_now``, a ``tojson`` that keeps non-ASCII text,
  ``bos_token`` / ``eos_token`` from the model), as transformers' ``apply_chat_template`` does.
- ``ChatTemplateError``: the template failed to render (its own ``raise_exception`` included);
  ``MessageError``: the messages are not a list of chat messages.
"""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from pydantic import BaseModel, ConfigDict, StrictStr, ValidationError

from kvres.policy import KvresError

from .chat_source import ChatTemplateSource


class ChatTemplateError(KvresError, ValueError):
    """The model's chat template could not render these messages."""


class MessageError(KvresError, ValueError):
    """``messages`` is not a list of chat messages; names the message and what is wrong."""


class ChatMessage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    role: Literal["system", "user", "assistant", "tool"]
    content: StrictStr


def messages_of(messages: Sequence[Mapping[str, Any] | ChatMessage]) -> list[ChatMessage]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise MessageError(f"messages must be a list of {{'role': ..., 'content': ...}}, got "
                           f"{type(messages).__name__} {messages!r:.80}")
    if not messages:
        raise MessageError("messages must hold at least one message")
    out = []
    for i, message in enumerate(messages):
        if isinstance(message, ChatMessage):
            out.append(message)
            continue
        try:
            out.append(ChatMessage.model_validate(message))
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'message'}: {e['msg']}" for e in exc.errors())
            raise MessageError(f"messages[{i}] is not a chat message ({problems}): {message!r:.80}") from None
    return out


def _raise(message: str) -> None:
    raise ChatTemplateError(f"the model's chat template refused the messages: {message}")


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


@functools.lru_cache(maxsize=16)
def _compiled(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"the model's chat template does not parse: {exc}") from None


def render_chat(
    source: ChatTemplateSource, messages: Sequence[Mapping[str, Any] | ChatMessage], add_generation_prompt: bool = True,
) -> str:
    checked = messages_of(messages)
    try:
        return _compiled(source.template).render(
            messages=[m.model_dump() for m in checked], add_generation_prompt=add_generation_prompt,
            bos_token=source.bos_token, eos_token=source.eos_token,
        )
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"the model's chat template failed to render: {exc}") from None
