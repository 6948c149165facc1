"""A conversation with tools rendered the model's own way.

Primitives:
- ``ToolTemplateError``: the model's template cannot render the tools or the tool turns (a 400
  over HTTP that says so).
- ``tools_in(messages) -> list[dict] | None``: the tools a conversation carries (its first
  message's ``tools``, ``kvres.actors.chat_template.ChatMessage``).
- ``render_conversation(source, messages, add_generation_prompt=True) -> str``: a template that
  names a tool family gets the tools as ``tools`` and the tool turns as they are (as transformers
  and llama-server give them); any other gets ``generic_messages`` (``families``); a conversation
  without tools or tool turns is rendered as ``render_chat`` renders it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..chat_source import ChatTemplateSource
from ..chat_template import ChatMessage, ChatTemplateError, messages_of, render_chat
from .families import family_of, generic_messages


class ToolTemplateError(ChatTemplateError):
    """The model's chat template cannot render these tools or tool turns."""


def tools_in(messages: Sequence[ChatMessage]) -> list[dict[str, Any]] | None:
    return messages[0].tools if messages else None


def _has_tool_turns(messages: Sequence[ChatMessage]) -> bool:
    return any(m.role == "tool" or m.tool_calls for m in messages)


def render_conversation(source: ChatTemplateSource, messages: Sequence[Mapping[str, Any] | ChatMessage],
                        add_generation_prompt: bool = True) -> str:
    checked = messages_of(messages)
    tools = tools_in(checked)
    if not tools and not _has_tool_turns(checked):
        return render_chat(source, checked, add_generation_prompt)
    family = family_of(source.template)
    try:
        if family == "generic":
            plain = generic_messages([m.model_dump(exclude_none=True) for m in checked], tools)
            return render_chat(source, plain, add_generation_prompt)
        return render_chat(source, checked, add_generation_prompt, tools=tools)
    except ChatTemplateError as exc:
        raise ToolTemplateError(f"the model's chat template cannot render these tools or tool turns "
                                f"({family} form): {exc}") from None
