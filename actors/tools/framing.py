"""How a Hermes-family template frames each call it writes, read from the template itself.

Primitives:
- ``HermesFraming(open, close, between)``: the text before a call's JSON (``<tool_call>`` and
  whatever whitespace the template puts after it), after it (through ``</tool_call>``) and between
  two calls. ``QWEN_FRAMING`` is Qwen 2.5's (a newline inside the tags on both sides, one between).
- ``hermes_framing(source) -> HermesFraming``: the framing the template of ``source`` writes,
  found by rendering an assistant turn of two probe calls; ``QWEN_FRAMING`` where it cannot be
  read from the render.

A forced call (``grammar.call_grammar``) is written with the framing the template itself uses,
so the next turn's render of that call is the text the model produced and the session keeps it
(no prefix break).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..chat_source import ChatTemplateSource

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class HermesFraming:
    open: str
    close: str
    between: str


QWEN_FRAMING = HermesFraming(OPEN_TAG + "\n", "\n" + CLOSE_TAG, "\n")
_PROBE_TOOL = {"type": "function", "function": {"name": "probe", "description": "probe",
                                                 "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}


def _probe_call(i: int) -> dict[str, object]:
    return {"id": f"call{i}", "type": "function", "function": {"name": "probe", "arguments": json.dumps({"x": i})}}


def hermes_framing(source: ChatTemplateSource) -> HermesFraming:
    from .rendering import render_conversation

    messages: list[dict[str, Any]] = [{"role": "user", "content": "probe", "tools": [_PROBE_TOOL]},
                {"role": "assistant", "content": None, "tool_calls": [_probe_call(1), _probe_call(2)]}]
    try:
        text = render_conversation(source, messages, add_generation_prompt=False)
    except Exception:  # a template that cannot render the probe: the family's usual framing
        return QWEN_FRAMING
    first = text.find(OPEN_TAG)
    if first < 0:
        return QWEN_FRAMING
    start = text.find("{", first)
    try:
        _, length = json.JSONDecoder().raw_decode(text[start:])
    except ValueError:
        return QWEN_FRAMING
    end = start + length
    closing = text.find(CLOSE_TAG, end)
    second = text.find(OPEN_TAG, closing)
    opening = text[first:start]
    if closing < 0 or second < 0 or opening.strip() != OPEN_TAG or text[end:closing].strip():
        return QWEN_FRAMING
    between = text[closing + len(CLOSE_TAG):second]
    if between.strip():
        return QWEN_FRAMING
    return HermesFraming(opening, text[end:closing] + CLOSE_TAG, between)
