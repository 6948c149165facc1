"""Where a conversation stopped agreeing with what its session held (why a turn was not cached).

Primitives:
- ``describe_break(source, messages, said, rendered, token) -> dict``: ``said`` (the log read back
  as text) and ``rendered`` (the conversation the template renders now) first differ at the
  session's token ``token``: ``{"message": i, "token": token, "char": c, "held": ..., "now": ...}``,
  ``i`` the index of the message whose rendering holds the first differing character (the number
  of messages where it is past them all: the log held more than the conversation says), ``held`` /
  ``now`` a few words from there on in each (``before``: the words just before).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..chat_source import ChatTemplateSource
from ..chat_template import ChatMessage, ChatTemplateError
from ..tools.rendering import render_conversation

CONTEXT_CHARS = 40


def _message_at(source: ChatTemplateSource, messages: Sequence[Mapping[str, Any] | ChatMessage], char: int) -> int:
    """The first message whose rendering reaches past ``char`` (its end beyond it)."""
    for k in range(1, len(messages) + 1):
        with contextlib.suppress(ChatTemplateError):  # a template that refuses a cut conversation: look further
            if len(render_conversation(source, messages[:k], add_generation_prompt=False)) > char:
                return k - 1
    return len(messages)


def describe_break(source: ChatTemplateSource, messages: Sequence[Mapping[str, Any] | ChatMessage], said: str,
                   rendered: str, token: int) -> dict[str, Any]:
    char = len(os.path.commonprefix([said, rendered]))
    return {"message": _message_at(source, messages, char), "token": token, "char": char,
            "before": said[max(0, char - CONTEXT_CHARS):char], "held": said[char:char + CONTEXT_CHARS],
            "now": rendered[char:char + CONTEXT_CHARS]}
