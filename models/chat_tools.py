"""Tool-calling and JSON conversations for the project's tiny chat model (seeded; no torch).

Primitives:
- ``tool_spec(name, description, params, style)``: one tool as transformers and llama-server pass
  it (``{"type": "function", "function": {"name", "description", "parameters"}}``); ``style``
  ``"agents"`` writes the JSON schema other agent frameworks send (``title``, ``required``,
  ``additionalProperties``).
- ``call_message(calls)`` / ``call_text(name, args)``: an assistant message with OpenAI
  ``tool_calls`` (arguments a JSON string), and the Hermes-style text the template renders for one
  call: ``<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>``.
- ``tool_task(rng, kind_weights=KIND_WEIGHTS) -> (tools, messages, families)``: one user turn that needs 1-3 calls and its
  whole exchange (call, ``tool`` result, ..., final answer): arithmetic chains over an add-like
  and a multiply-like tool, a lookup tool (key -> value), and lookups summed with the add tool.
  Tool names, descriptions and parameter names are drawn from pools, so the model copies the
  request's names instead of memorising one.
- ``json_turn(rng, state) -> (question, answer)``: a question whose answer is a short JSON object
  (``{"answer": 7}``, ``{"name": "anna", "age": 31}``), for ``response_format`` requests;
  ``json_value(rng, kind)``: one value of a ``JSON_KEYS`` kind (``int``, ``digit``, ``bool``, ...).
- ``tool_words()``: the words these generators write, for the vocabulary.
"""

from __future__ import annotations

import json
import random
from typing import Any

ADD_NAMES = ("add", "plus", "sum", "add_numbers", "addition", "add_two", "calc_sum", "sum_numbers")
MUL_NAMES = ("multiply", "times", "mul", "product", "multiply_numbers", "mult", "calc_product")
LOOKUP_NAMES = ("lookup", "get_value", "find", "fetch", "look_up", "get", "read_value", "table")
PARAM_PAIRS = (("a", "b"), ("x", "y"), ("first", "second"), ("left", "right"), ("m", "n"), ("p", "q"),
               ("num", "other"), ("value", "by"))
LOOKUP_PARAMS = ("key", "name", "query", "item", "word", "id")
ADD_DESCRIPTIONS = ("add two numbers.", "return the sum of two numbers.", "adds two integers.",
                    "sum of a and b.", "add the two values and return the sum.", "")
MUL_DESCRIPTIONS = ("multiply two numbers.", "return the product of two numbers.", "multiplies two integers.",
                    "product of a and b.", "multiply the two values and return the product.", "")
LOOKUP_DESCRIPTIONS = ("look up the value of a key.", "find the value stored under a key.",
                       "get a value from the table.", "return the value of an item.", "")
# tools the questions never need: the model learns to pass them by
DISTRACTORS = (
    ("get_weather", "get the weather in a city.", (("city", "string"),)),
    ("send_email", "send an email.", (("to", "string"), ("body", "string"))),
    ("search", "search the web.", (("query", "string"),)),
    ("get_time", "return the time in a zone.", (("zone", "string"),)),
)
LOOKUP_VALUES = ("red", "blue", "green", "cat", "dog", "moon", "tea", "cake")
JSON_KEYS = {  # key -> value kind
    "answer": "int", "result": "int", "value": "int", "n": "digit", "count": "int", "age": "int", "id": "int",
    "ok": "bool", "done": "bool", "name": "name", "color": "color", "word": "word",
}
_COLORS = ("red", "blue", "green", "yellow", "black", "white")
_WORDS = ("cat", "dog", "bird", "tree", "house", "sun", "moon", "book", "car", "apple")
_JSON_ASKS = ("{q} answer in json.", "{q} reply with json.", "json please: {q}", "{q} give json.")
_JSON_OBJECT_ASKS = ("give me json with {keys}.", "json with {keys}.", "make a json object with {keys}.")
_ARITH = {
    "add": ("what is {0} plus {1}?", "add {0} and {1}.", "{0} plus {1}?"),
    "mul": ("what is {0} times {1}?", "multiply {0} by {1}.", "{0} times {1}?"),
}
_CHAIN_SAME = {
    "add": ("what is {nums_plus}?", "add {nums_and}."),
    "mul": ("what is {nums_times}?", "multiply {nums_and}."),
}
_THEN = {"add": "then add {0}", "mul": "then multiply by {0}"}
_FIRST = {"add": "add {0} and {1}", "mul": "multiply {0} by {1}"}
_LOOKUP_ASKS = ("what is the value of {k}?", "look up {k}.", "find {k}.", "what is stored under {k}?")
_LOOKUP_SUM_ASKS = ("add the values of {k} and {j}.", "what is {k} plus {j} in the table?")


def tool_spec(name: str, description: str, params: list[tuple[str, str]], style: str = "plain") -> dict[str, Any]:
    props: dict[str, Any] = {}
    for p, typ in params:
        props[p] = {"title": p.capitalize(), "type": typ} if style == "agents" else {"type": typ}
    schema: dict[str, Any] = {"properties": props, "required": [p for p, _ in params], "type": "object"}
    if style == "agents":
        schema["additionalProperties"] = False
    else:
        schema = {"type": "object", "properties": props, "required": [p for p, _ in params]}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


def call_text(name: str, args: dict[str, Any]) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(args)}}}</tool_call>'


def call_message(name: str, args: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


class _Calls:
    """The messages of one tool exchange, with call ids numbered in order."""

    def __init__(self, rng: random.Random) -> None:
        self.messages: list[dict[str, Any]] = []
        self.families: list[str] = []
        self._id = rng.randint(0, 10**6)

    def call(self, name: str, args: dict[str, Any], result: str) -> None:
        call_id = f"call_{self._id}"
        self._id += 1
        self.messages.append(call_message(name, args, call_id))
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        self.families.append("tool_call")

    def answer(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})
        self.families.append("tool_answer")


def _tool(rng: random.Random, names: tuple[str, ...], descriptions: tuple[str, ...], params: list[str],
          typ: str) -> tuple[str, list[str], dict[str, Any]]:
    name = rng.choice(names)
    style = "agents" if rng.random() < 0.4 else "plain"
    return name, params, tool_spec(name, rng.choice(descriptions), [(p, typ) for p in params], style)


def _join_and(nums: list[int]) -> str:
    return ", ".join(map(str, nums[:-1])) + f" and {nums[-1]}"


TASK_KINDS = ("arith", "chain", "mixed", "lookup", "lookup_sum")
KIND_WEIGHTS = (3, 3, 3, 3, 2)  # the held-out sets' mix; training may draw another (ChatTrainConfig)


def tool_task(rng: random.Random, kind_weights: tuple[float, ...] = KIND_WEIGHTS,
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """Tools, the user turn and its exchange; ``families`` has one entry per assistant message;
    ``kind_weights``: how often each of ``TASK_KINDS`` is drawn."""
    num_type = rng.choice(("integer", "number"))
    add = _tool(rng, ADD_NAMES, ADD_DESCRIPTIONS, list(rng.choice(PARAM_PAIRS)), num_type)
    mul = _tool(rng, MUL_NAMES, MUL_DESCRIPTIONS, list(rng.choice(PARAM_PAIRS)), num_type)
    look = _tool(rng, LOOKUP_NAMES, LOOKUP_DESCRIPTIONS, [rng.choice(LOOKUP_PARAMS)], "string")
    kind = rng.choices(TASK_KINDS, kind_weights)[0]
    ex = _Calls(rng)
    if kind in ("arith", "chain", "mixed"):
        n_calls = 1 if kind == "arith" else rng.randint(2, 3)
        ops = [rng.choice(("add", "mul"))] * n_calls if kind != "mixed" else [rng.choice(("add", "mul"))
                                                                              for _ in range(n_calls)]
        if kind == "mixed" and len(set(ops)) == 1:
            ops[-1] = "mul" if ops[0] == "add" else "add"
        nums = [rng.randint(0, 9) for _ in range(n_calls + 1)]
        if kind == "arith":
            question = rng.choice(_ARITH[ops[0]]).format(*nums)
        elif kind == "chain":
            word = " plus " if ops[0] == "add" else " times "
            question = rng.choice(_CHAIN_SAME[ops[0]]).format(
                nums_plus=word.join(map(str, nums)), nums_times=word.join(map(str, nums)), nums_and=_join_and(nums))
        else:
            parts = [_FIRST[ops[0]].format(nums[0], nums[1])] + [_THEN[op].format(n) for op, n in
                                                                  zip(ops[1:], nums[2:], strict=True)]
            question = ", ".join(parts) + "."
        needed = [add if "add" in ops else None, mul if "mul" in ops else None]
        acc = nums[0]
        for op, n in zip(ops, nums[1:], strict=True):
            name, params, _ = add if op == "add" else mul
            value = acc + n if op == "add" else acc * n
            ex.call(name, {params[0]: acc, params[1]: n}, str(value))
            acc = value
        ex.answer(f"{acc}.")
        tools = [t[2] for t in needed if t is not None]
        if rng.random() < 0.5:
            tools.append(look[2])
    else:
        name, params, _ = look
        keys = rng.sample(_WORDS, 2)
        if kind == "lookup":
            value = str(rng.randint(0, 999)) if rng.random() < 0.6 else rng.choice(LOOKUP_VALUES)
            question = rng.choice(_LOOKUP_ASKS).format(k=keys[0])
            ex.call(name, {params[0]: keys[0]}, value)
            ex.answer(f"{value}.")
            tools = [look[2]] + ([add[2]] if rng.random() < 0.5 else [])
        else:
            values = [rng.randint(0, 99) for _ in keys]
            question = rng.choice(_LOOKUP_SUM_ASKS).format(k=keys[0], j=keys[1])
            for k, v in zip(keys, values, strict=True):
                ex.call(name, {params[0]: k}, str(v))
            add_name, add_params, _ = add
            ex.call(add_name, {add_params[0]: values[0], add_params[1]: values[1]}, str(sum(values)))
            ex.answer(f"{sum(values)}.")
            tools = [look[2], add[2]]
    if rng.random() < 0.3:
        d_name, d_desc, d_params = rng.choice(DISTRACTORS)
        tools.append(tool_spec(d_name, d_desc, list(d_params)))
    rng.shuffle(tools)
    return tools, [{"role": "user", "content": question}, *ex.messages], ex.families


def json_value(rng: random.Random, kind: str) -> Any:
    if kind == "int":
        return rng.randint(0, 99)
    if kind == "digit":
        return rng.randint(0, 9)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "name":
        from models.chat_tasks import NAMES

        return rng.choice(NAMES)
    return rng.choice(_COLORS if kind == "color" else _WORDS)


def json_turn(rng: random.Random, question: str, answer: str) -> tuple[str, str]:
    """A question (``question`` with its plain ``answer``) asked for JSON, or a JSON object with named keys."""
    if rng.random() < 0.5:
        plain = answer.rstrip(".")
        value: Any = plain
        if plain.isdigit():
            value = int(plain)
        elif plain in ("yes", "no"):
            value = plain == "yes"
        key = rng.choice(("answer", "answer", "result", "value")) if not isinstance(value, str) else "answer"
        ask = rng.choice(_JSON_ASKS).format(q=question)
        return ask, json.dumps({key: value})
    keys = rng.sample(sorted(JSON_KEYS), rng.randint(1, 3))
    said = keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + " and " + keys[-1]
    return rng.choice(_JSON_OBJECT_ASKS).format(keys=said), json.dumps({k: json_value(rng, JSON_KEYS[k])
                                                                        for k in keys})


def tool_words() -> list[str]:
    texts: list[str] = [*ADD_NAMES, *MUL_NAMES, *LOOKUP_NAMES, *LOOKUP_PARAMS, *ADD_DESCRIPTIONS,
                        *MUL_DESCRIPTIONS, *LOOKUP_DESCRIPTIONS, *LOOKUP_VALUES, *JSON_KEYS, *_COLORS, *_WORDS,
                        *_JSON_ASKS, *_JSON_OBJECT_ASKS, *_LOOKUP_ASKS, *_LOOKUP_SUM_ASKS, *_THEN.values(),
                        *_FIRST.values(), "true false null arguments tools integer number string boolean object array",
                        "any title"]
    texts += [p for pair in PARAM_PAIRS for p in pair]
    texts += [f"{n} {d}" for n, d, _ in DISTRACTORS] + [p for *_, ps in DISTRACTORS for p, _ in ps]
    for phrases in (*_ARITH.values(), *_CHAIN_SAME.values()):
        texts += phrases
    words: set[str] = set()
    for text in texts:
        for w in text.replace("_", " ").replace("{", " ").replace("}", " ").split():
            w = w.strip(".,!?:+-0123456789")
            if w.isascii() and w.isalpha() and w.islower():
                words.add(w)
    return sorted(words)
