"""Tool-calling families: which syntax a model calls tools in, read from its chat template.

Primitives:
- ``FAMILIES``: ``hermes`` (Hermes, Qwen 2.5 / 3: ``<tool_call>{"name", "arguments"}</tool_call>``,
  one block per call), ``llama3`` (Llama 3.1 - 3.3: a JSON object ``{"name", "parameters"}``,
  after ``<|python_tag|>`` where the model writes it), ``mistral`` (``[TOOL_CALLS]`` then a JSON
  list of ``{"name", "arguments"}``), ``generic`` (a template with no tool support: kvres
  describes the tools in a system message and the model answers ``{"tool_calls": [{"name",
  "arguments"}]}``).
- ``family_of(template) -> str``: the family a template's own text names (its call markers), else
  ``generic``; ``renders_tools(template)``: whether the template reads ``tools`` at all.
- ``generic_messages(messages, tools) -> list[dict]``: a conversation as a template without tool
  support can render it: the tools and the answer format in the system message (the first one,
  or a new one), each assistant turn's calls written as its JSON, each tool result a user turn.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

FAMILIES = ("hermes", "llama3", "mistral", "generic")
_READS_TOOLS = re.compile(r"\btools\b")


def renders_tools(template: str | None) -> bool:
    return bool(template) and _READS_TOOLS.search(template or "") is not None


def family_of(template: str | None) -> str:
    if not renders_tools(template):
        return "generic"
    assert template is not None
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|start_header_id|>" in template:
        return "llama3"
    return "generic"


def _arguments(function: Mapping[str, Any]) -> Any:
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def generic_instructions(tools: Sequence[Mapping[str, Any]]) -> str:
    described = "\n".join(json.dumps(tool.get("function", tool), ensure_ascii=False) for tool in tools)
    return ("You can call these functions:\n" + described + "\n"
            'To call functions, answer with only this JSON: {"tool_calls": [{"name": <function name>, '
            '"arguments": <arguments object>}]}')


def generic_call_text(calls: Sequence[Mapping[str, Any]]) -> str:
    """The JSON a generic-family model answers calls with (``calls``: OpenAI ``tool_calls`` entries)."""
    written = [{"name": c.get("function", {}).get("name"), "arguments": _arguments(c.get("function", {}))}
               for c in calls]
    return json.dumps({"tool_calls": written}, ensure_ascii=False)


def generic_messages(messages: Sequence[Mapping[str, Any]],
                     tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in messages:
        role, content = message.get("role"), message.get("content") or ""
        if role == "assistant" and message.get("tool_calls"):
            text = generic_call_text(message["tool_calls"])
            out.append({"role": "assistant", "content": f"{content}\n{text}" if content else text})
        elif role == "tool":
            result = {"tool_call_id": message.get("tool_call_id"), "result": content}
            out.append({"role": "user", "content": json.dumps(result, ensure_ascii=False)})
        else:
            out.append({"role": role, "content": content})
    if tools:
        instructions = generic_instructions(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{instructions}"}
        else:
            out.insert(0, {"role": "system", "content": instructions})
    return out
