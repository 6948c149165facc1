"""A model's own chat template, rendered the way llama.cpp and transformers render it.

Primitives:
- ``ChatMessage(role, content, tool_calls, tool_call_id, name, tools)``: one message (pydantic;
  ``role`` one of system, user, assistant, tool; ``content`` a string, or None on an assistant
  turn that only calls tools; ``tool_calls``: OpenAI's entries, ``{"id", "type": "function",
  "function": {"name", "arguments"}}``; ``tool_call_id`` / ``name`` on a tool result; ``tools``,
  on the conversation's first message only: the tools offered, which every path that carries a
  conversation carries with it).
- ``messages_of(messages) -> list[ChatMessage]``: validated (a typed error naming the message).
- ``render_chat(source, messages, add_generation_prompt=True, tools=None) -> str``: the template
  of a ``ChatTemplateSource`` rendered in a sandboxed Jinja2 environment (trim_blocks, lstrip_blocks,
  loop controls, ``raise_exception``, ``strftime_now``, a ``tojson`` that keeps non-ASCII text,
  ``bos_token`` / ``eos_token`` from the model), as transformers' ``apply_chat_template`` does:
  ``tools`` given to the template as ``tools``, a tool call's ``arguments`` as an object, fields
  a message does not have left undefined (``kvres.actors.tools.rendering`` decides what a model
  is given).
- ``ChatTemplateError``: the template failed to render (its own ``raise_exception`` included);
  ``MessageError``: the messages are not a list of chat messages.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from pydantic import BaseModel, ConfigDict, StrictStr, ValidationError, model_validator

from kvres.policy import KvresError

from .chat_source import ChatTemplateSource


class ChatTemplateError(KvresError, ValueError):
    """The model's chat template could not render these messages."""


class MessageError(KvresError, ValueError):
    """``messages`` is not a list of chat messages; names the message and what is wrong."""


class ChatMessage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    role: Literal["system", "user", "assistant", "tool"]
    content: StrictStr | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: StrictStr | None = None
    name: StrictStr | None = None
    tools: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _content_or_calls(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content must be a string (None only on an assistant turn with tool_calls)")
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"tool_calls belong on an assistant message, not a {self.role} one")
        return self


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


def _for_template(message: ChatMessage) -> dict[str, Any]:
    """The message as templates read it: no ``tools``, absent fields undefined, content a string
    (``""`` beside tool calls), each call's arguments an object (as transformers and llama-server
    give them; a template writes them with ``tojson``)."""
    out = message.model_dump(exclude_none=True, exclude={"tools"})
    out.setdefault("content", "")
    if message.tool_calls:
        out["tool_calls"] = [_call_for_template(call) for call in message.tool_calls]
    return out


def _call_for_template(call: Mapping[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):  # not JSON: the template gets the text as it is
            function["arguments"] = json.loads(arguments)
    return {**call, "function": function}


def render_chat(
    source: ChatTemplateSource, messages: Sequence[Mapping[str, Any] | ChatMessage], add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    checked = messages_of(messages)
    extra = {"tools": tools} if tools is not None else {}
    try:
        return _compiled(source.template).render(
            messages=[_for_template(m) for m in checked], add_generation_prompt=add_generation_prompt,
            bos_token=source.bos_token, eos_token=source.eos_token, **extra,
        )
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"the model's chat template failed to render: {exc}") from None
