"""Tool calls read from a model's reply, in its family's syntax (``families``), whole or streamed.

Primitives:
- ``ParsedReply(content, calls, problem)``: the text before the calls (None where there is none),
  the calls (``ToolCall``, ids new; ``arguments`` the JSON text of the object the model wrote) and,
  where the reply looked like calls but did not make valid ones, why (the reply is then content).
- ``parse_reply(family, text, functions) -> ParsedReply``: calls in the family's form; a call of a
  function not offered, arguments that are not an object or do not validate against the
  function's schema (``schema_check.argument_problems``), or JSON cut short leave the reply as
  text.
- ``CallStream(family, functions)``: a streamed reply: ``push(piece) -> str`` is the text that
  can go out now as content (held back from where calls may begin: a family's marker, or a prefix
  of it, or a reply that opens as the family's calls do); ``finish() -> (rest, ParsedReply)``:
  what content is still to send and the reply parsed whole.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .schema_check import argument_problems
from .specs import FunctionSpec, ToolCall, new_call_id

MARKERS = {"hermes": ("<tool_call>",), "mistral": ("[TOOL_CALLS]",), "llama3": ("<|python_tag|>",),
           "generic": ('{"tool_calls"',)}
OPENINGS = {"llama3": ("{",), "mistral": ("[{",), "hermes": (), "generic": ()}  # calls that open the reply
_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ParsedReply:
    content: str | None
    calls: list[ToolCall] = field(default_factory=list)
    problem: str | None = None


def _json_values(text: str, separators: str = " \t\r\n") -> list[Any]:
    """The JSON values ``text`` holds one after another (``separators`` between them)."""
    values: list[Any] = []
    at = 0
    while True:
        while at < len(text) and text[at] in separators:
            at += 1
        if at >= len(text):
            return values
        value, at = _DECODER.raw_decode(text, at)
        values.append(value)


def _raw_calls(family: str, text: str) -> list[Any]:
    if family == "hermes":
        out = []
        for block in _HERMES_BLOCK.findall(text):
            out += _json_values(block)
        return out
    if family == "llama3":
        return _json_values(text.replace("<|python_tag|>", "", 1), " \t\r\n;")
    if family == "mistral":
        values = _json_values(text.replace("[TOOL_CALLS]", "", 1))
        return [c for v in values for c in (v if isinstance(v, list) else [v])]
    values = _json_values(text)
    return [c for v in values for c in (v.get("tool_calls", [v]) if isinstance(v, dict) else [v])]


def _call_start(family: str, text: str) -> int | None:
    starts = [text.find(m) for m in MARKERS[family] if m in text]
    stripped = text.lstrip()
    if any(stripped.startswith(o) for o in OPENINGS[family]):
        starts.append(len(text) - len(stripped))
    return min(starts) if starts else None


def parse_reply(family: str, text: str, functions: Sequence[FunctionSpec]) -> ParsedReply:
    start = _call_start(family, text)
    if start is None:
        return ParsedReply(text)
    whole = ParsedReply(text)
    try:
        raw = _raw_calls(family, text[start:])
    except ValueError as exc:
        return ParsedReply(text, problem=f"the calls are not JSON: {exc}")
    by_name = {f.name: f for f in functions}
    calls = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return ParsedReply(text, problem=f"a call must be an object with a name, got {item!r:.80}")
        spec = by_name.get(item["name"])
        if spec is None:
            return ParsedReply(text, problem=f"the reply calls {item['name']!r}, which is not one of {list(by_name)}")
        arguments = item.get("arguments", item.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return ParsedReply(text, problem=f"{spec.name}'s arguments are not JSON: {arguments!r:.80}")
        if not isinstance(arguments, dict):
            return ParsedReply(text, problem=f"{spec.name}'s arguments must be an object, got {arguments!r:.80}")
        problems = argument_problems(arguments, spec.parameters)
        if problems:
            return ParsedReply(text, problem=f"{spec.name}'s arguments do not validate: {'; '.join(problems)}")
        written_id = item.get("id")  # Mistral's calls carry their ids
        call_id = written_id if isinstance(written_id, str) else new_call_id(family)
        calls.append(ToolCall(call_id, spec.name, json.dumps(arguments, ensure_ascii=False)))
    if not calls:
        return whole
    content = text[:start].strip()
    return ParsedReply(content or None, calls)


class CallStream:
    def __init__(self, family: str, functions: Sequence[FunctionSpec]) -> None:
        self.family, self.functions = family, functions
        self.text = ""
        self.sent = 0  # how much of ``text`` went out as content
        self.holding = False  # calls may have begun: nothing more goes out before the end

    def push(self, piece: str) -> str:
        self.text += piece
        if self.holding:
            return ""
        if _call_start(self.family, self.text) is not None:
            self.holding = True
            start = _call_start(self.family, self.text)
            assert start is not None
            return self._send_to(start)
        stripped = self.text.lstrip()
        if any(o.startswith(stripped) for o in OPENINGS[self.family]):
            return ""  # the reply may still open as calls do
        return self._send_to(len(self.text) - self._marker_prefix())

    def _marker_prefix(self) -> int:
        """How long the end of the text that may be the start of a marker is."""
        for marker in MARKERS[self.family]:
            for n in range(min(len(marker) - 1, len(self.text)), 0, -1):
                if self.text.endswith(marker[:n]):
                    return n
        return 0

    def _send_to(self, end: int) -> str:
        if end <= self.sent:
            return ""
        out, self.sent = self.text[self.sent:end], end
        return out

    def finish(self) -> tuple[str, ParsedReply]:
        parsed = parse_reply(self.family, self.text, self.functions)
        start = _call_start(self.family, self.text)
        if parsed.calls and start is not None:
            return self.text[self.sent:start].rstrip() if start > self.sent else "", parsed
        return self.text[self.sent:], parsed
