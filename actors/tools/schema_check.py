"""JSON schemas of tool parameters, and arguments checked against them.

Primitives:
- ``check_schema(schema, field)``: ``schema`` is a JSON schema (``ToolError`` naming ``field``
  otherwise): by the ``jsonschema`` package's own meta-schema check where it is installed, else by
  the rules of the subset tools use (``type``, ``properties``, ``required``, ``enum``, ``items``).
- ``argument_problems(values, schema) -> list[str]``: what is wrong with the arguments of a call
  (empty when they validate), by ``jsonschema`` where installed, else by the same subset.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from .errors import ToolError

TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
HAS_JSONSCHEMA = importlib.util.find_spec("jsonschema") is not None


def _subset_problem(schema: Any, where: str) -> str | None:
    if not isinstance(schema, Mapping):
        return f"{where}: a schema must be an object, got {type(schema).__name__} {schema!r:.60}"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for k in kinds:
        if k not in TYPES:
            return f"{where}.type: must be one of {list(TYPES)}, got {k!r:.40}"
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        return f"{where}.properties: must be an object, got {type(properties).__name__}"
    for name, sub in properties.items():
        problem = _subset_problem(sub, f"{where}.properties.{name}")
        if problem:
            return problem
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        return f"{where}.required: must be a list of property names, got {required!r:.60}"
    if "enum" in schema and not isinstance(schema["enum"], list):
        return f"{where}.enum: must be a list, got {schema['enum']!r:.60}"
    if "items" in schema:
        return _subset_problem(schema["items"], f"{where}.items")
    return None


def check_schema(schema: Any, field: str) -> None:
    problem = _subset_problem(schema, field)
    if problem is None and HAS_JSONSCHEMA:
        import jsonschema

        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            path = "".join(f".{p}" for p in exc.path)
            problem = f"{field}{path}: not a valid JSON schema: {exc.message:.200}"
    if problem is not None:
        where, _, message = problem.partition(": ")
        raise ToolError(message, where)


def _matches(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and value.is_integer()
    return {
        "object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "null": lambda v: v is None,
    }[kind](value)


def _subset_problems(value: Any, schema: Mapping[str, Any], where: str) -> list[str]:
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    if kinds and not any(_matches(value, k) for k in kinds):
        return [f"{where or 'arguments'}: {value!r:.40} is not of type {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where or 'arguments'}: {value!r:.40} is not one of {schema['enum']}"]
    out = []
    if isinstance(value, dict):
        for name in schema.get("required", []):
            if name not in value:
                out.append(f"{where or 'arguments'}: {name!r} is a required property")
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                out += _subset_problems(value[name], sub, f"{where}.{name}" if where else name)
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            out += _subset_problems(item, schema["items"], f"{where}[{i}]")
    return out


def argument_problems(values: Any, schema: Mapping[str, Any]) -> list[str]:
    if HAS_JSONSCHEMA:
        import jsonschema

        validator = jsonschema.validators.validator_for(schema)(schema)
        return [f"{'.'.join(map(str, e.path)) or 'arguments'}: {e.message:.200}"
                for e in validator.iter_errors(values)]
    return _subset_problems(values, schema, "")
