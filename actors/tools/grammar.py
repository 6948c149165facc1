"""The grammar that makes a model call tools when ``tool_choice`` says it must.

Primitives:
- ``call_schema(family, function) -> dict``: the JSON schema of one call to ``function`` as the
  family writes it (``{"name": <const>, "arguments": <its parameters>}``; Llama 3's key is
  ``parameters``).
- ``call_grammar(family, functions, parallel, framing=QWEN_FRAMING) -> str``: GBNF whose every sentence is one call (or,
  ``parallel``, one to ``MAX_PARALLEL_CALLS``) to one of ``functions`` in the family's syntax, arguments following
  their schemas (turned into GBNF by llama-cpp-python's converter, as ``response_format`` schemas
  are, with JSON's spacing fixed to what the family's template writes), so a forced call always
  parses and validates and reads as the template renders it; the engine ends the turn once it is
  complete. ``tool_choice`` ``required`` passes every function, a named one only that one. A Hermes
  call is framed as the model's own template frames it (``framing.hermes_framing``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from kvres.actors.sampling import SamplingParams

from .framing import QWEN_FRAMING, HermesFraming
from .specs import FunctionSpec

CALL_RULE = "kvres-tool-call"
MAX_PARALLEL_CALLS = 4  # a parallel reply's calls are bounded, so that an untrained model's ends too
MORE = MAX_PARALLEL_CALLS - 1
_ROOT = re.compile(r"^root ::=", re.MULTILINE)
_SPACE = re.compile(r"^space ::= .*$", re.MULTILINE)


def call_schema(family: str, function: FunctionSpec) -> dict[str, Any]:
    key = "parameters" if family == "llama3" else "arguments"
    properties: dict[str, Any] = {"name": {"const": function.name}, key: function.parameters}
    if family == "mistral":  # its template writes each call's id after it: nine letters and digits
        properties["id"] = {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}
    return {"type": "object", "properties": properties, "required": list(properties)}


def _canonical(rules: str) -> str:
    """The converter's JSON written as ``json.dumps`` (and a template's ``tojson``) writes it:
    ``{"a": 1, "b": [2, 3]}``, a space after each colon and comma and nowhere else, so the call a
    model makes reads exactly as the template renders it in the next turn (the session keeps it)."""
    rules = rules.replace('":" space', '": "').replace('"," space', '", "')
    return _SPACE.sub('space ::= ""', rules)


def _lit(text: str) -> str:
    return json.dumps(text)  # a GBNF literal escapes as a JSON string does


def call_grammar(family: str, functions: Sequence[FunctionSpec], parallel: bool = False,
                 framing: HermesFraming = QWEN_FRAMING) -> str:
    from kvres.actors.engines.llama.sampler_chain import to_gbnf

    if not functions:
        raise ValueError("a tool grammar needs at least one function")
    schemas = [call_schema(family, f) for f in functions]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    rules = to_gbnf(SamplingParams(json_schema=schema))
    assert rules is not None
    rules = _canonical(_ROOT.sub(f"{CALL_RULE} ::=", rules))
    call = CALL_RULE
    if family == "hermes":
        block = f"{_lit(framing.open)} {call} {_lit(framing.close)}"
        between = f"{_lit(framing.between)} " if framing.between else ""
        root = f"{block} ( {between}{block} ){{0,{MORE}}}" if parallel else block
    elif family == "mistral":
        root = f'{_lit("[TOOL_CALLS] [")} {call} ( ", " {call} ){{0,{MORE}}} "]"' if parallel else \
            f'{_lit("[TOOL_CALLS] [")} {call} "]"'
    elif family == "llama3":
        root = call  # Llama 3.1's template writes one call per turn
    else:
        opening = _lit('{"tool_calls": [')
        root = f'{opening} {call} ( ", " {call} ){{0,{MORE}}} "]}}"' if parallel else f'{opening} {call} "]}}"'
    return f"root ::= {root}\n{rules}"
