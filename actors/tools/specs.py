"""The tools a request offers, the choice among them and the calls a model makes, validated.

Primitives:
- ``FunctionSpec(name, description, parameters, strict)``: one function the model may call;
  ``as_tool()`` is the OpenAI chat shape (``{"type": "function", "function": {...}}``), the
  one chat templates are given.
- ``functions_of(tools, field="tools", flat=False) -> list[FunctionSpec]``: OpenAI's chat tools
  (``{"type": "function", "function": {...}}``) or, ``flat``, the Responses API's
  (``{"type": "function", "name": ...}``); names unique, ``[A-Za-z0-9_-]{1,64}``, parameters a
  JSON schema (``schema_check.check_schema``).
- ``ToolChoice(mode, name)``: ``mode`` one of none, auto, required, function (``name`` set);
  ``choice_of(raw, functions, field="tool_choice", flat=False)``: "none" / "auto" / "required",
  ``{"type": "function", "function": {"name": ...}}`` (flat: ``{"type": "function", "name": ...}``).
- ``ToolCall(id, name, arguments)``: one call, ``arguments`` the JSON text of an object;
  ``as_chat()`` is the OpenAI ``tool_calls`` entry; ``new_call_id(family)``: an id the family's
  template accepts (Mistral's: nine letters and digits).
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import ToolError
from .schema_check import check_schema

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CHOICE_MODES = ("none", "auto", "required")
_ALNUM = string.ascii_letters + string.digits


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    description: str | None = None
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None

    def as_tool(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


def _function_of(raw: Any, where: str) -> FunctionSpec:
    if not isinstance(raw, Mapping):
        raise ToolError(f"a function must be an object, got {type(raw).__name__} {raw!r:.60}", where)
    unknown = sorted(set(raw) - {"name", "description", "parameters", "strict"})
    if unknown:
        raise ToolError(f"unknown fields {unknown}", where)
    name = raw.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ToolError(f"name must be 1 to 64 letters, digits, '_' or '-', got {name!r:.70}", f"{where}.name")
    description = raw.get("description")
    if description is not None and not isinstance(description, str):
        raise ToolError(f"description must be a string, got {type(description).__name__}", f"{where}.description")
    strict = raw.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ToolError(f"strict must be a boolean, got {strict!r:.40}", f"{where}.strict")
    parameters = raw.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    check_schema(parameters, f"{where}.parameters")
    if parameters.get("type", "object") != "object":
        raise ToolError(f"the parameters of a function must be an object schema, got type {parameters['type']!r}",
                        f"{where}.parameters.type")
    return FunctionSpec(name, description, dict(parameters), strict)


def functions_of(tools: Any, field: str = "tools", flat: bool = False) -> list[FunctionSpec]:
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
        raise ToolError(f"must be a list of tools, got {type(tools).__name__}", field)
    if len(tools) > 128:
        raise ToolError(f"at most 128 tools, got {len(tools)}", field)
    out: list[FunctionSpec] = []
    for i, tool in enumerate(tools):
        where = f"{field}[{i}]"
        if not isinstance(tool, Mapping):
            raise ToolError(f"a tool must be an object, got {type(tool).__name__} {tool!r:.60}", where)
        if tool.get("type") != "function":
            raise ToolError(f"only tools of type 'function' are supported, got {tool.get('type')!r:.40}",
                            f"{where}.type")
        if flat:
            out.append(_function_of({k: v for k, v in tool.items() if k != "type"}, where))
        else:
            if set(tool) - {"type", "function"}:
                raise ToolError(f"unknown fields {sorted(set(tool) - {'type', 'function'})}", where)
            out.append(_function_of(tool.get("function"), f"{where}.function"))
    names = [f.name for f in out]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ToolError(f"two tools are named {name!r}", f"{field}[{i}].name" if flat else f"{field}[{i}].function.name")
    return out


@dataclass(frozen=True)
class ToolChoice:
    mode: str  # none, auto, required, function
    name: str | None = None

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "function")


def choice_of(raw: Any, functions: Sequence[FunctionSpec], field: str = "tool_choice",
              flat: bool = False) -> ToolChoice:
    if raw is None:
        return ToolChoice("auto" if functions else "none")
    if isinstance(raw, str):
        if raw not in CHOICE_MODES:
            raise ToolError(f"must be one of {list(CHOICE_MODES)} or a function, got {raw!r:.40}", field)
        if raw == "required" and not functions:
            raise ToolError("'required' needs at least one tool in tools", field)
        return ToolChoice(raw)
    if not isinstance(raw, Mapping) or raw.get("type") != "function":
        raise ToolError(f"must be one of {list(CHOICE_MODES)} or {{'type': 'function', ...}}, got {raw!r:.60}", field)
    if flat:
        name, where = raw.get("name"), f"{field}.name"
    else:
        function = raw.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        where = f"{field}.function.name"
    known = [f.name for f in functions]
    if name not in known:
        raise ToolError(f"names no tool of the request: {name!r:.70} (the tools are {known})", where)
    return ToolChoice("function", str(name))


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the JSON text of an object

    def as_chat(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def argument_values(self) -> dict[str, Any]:
        value = json.loads(self.arguments)
        assert isinstance(value, dict)
        return value


def new_call_id(family: str) -> str:
    if family == "mistral":
        return "".join(secrets.choice(_ALNUM) for _ in range(9))
    return f"call_{secrets.token_hex(12)}"
