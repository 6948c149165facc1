"""The tool-format library without an engine: tools, choices and schemas validated with the field
named, calls parsed in each family's form (whole and streamed), arguments checked against the
function's schema, and the generic form a template without tools is given."""

from __future__ import annotations

import json

import pytest

from kvres.actors.tools import schema_check
from kvres.actors.tools.errors import ToolError
from kvres.actors.tools.families import family_of, generic_messages
from kvres.actors.tools.parsing import CallStream, parse_reply
from kvres.actors.tools.specs import choice_of, functions_of, new_call_id
from kvres.testing import family_templates as templates

ADD = {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
LOOK = {"type": "function", "function": {"name": "look_up", "parameters": {
    "type": "object", "properties": {"key": {"type": "string", "enum": ["x", "y"]},
                                     "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["key"]}}}
FUNCTIONS = functions_of([ADD, LOOK])


@pytest.mark.parametrize(("tools", "field"), [
    ("add", "tools"),
    ([{"type": "retrieval"}], "tools[0].type"),
    ([{"type": "function", "function": {"name": "a b"}}], "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "wat"}}}],
     "tools[0].function.parameters.type"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": "a"}}}],
     "tools[0].function.parameters.required"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
     "tools[0].function.parameters.type"),
    ([ADD, ADD], "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "f"}, "extra": 1}], "tools[0]"),
])
def test_malformed_tools_name_the_field(tools: object, field: str) -> None:
    with pytest.raises(ToolError) as err:
        functions_of(tools)
    assert err.value.field == field, str(err.value)


def test_flat_tools_of_the_responses_api() -> None:
    flat = [{"type": "function", "name": "add", "parameters": ADD["function"]["parameters"]}]
    assert functions_of(flat, flat=True)[0].parameters == ADD["function"]["parameters"]
    with pytest.raises(ToolError, match="tools\\[0\\].name"):
        functions_of([{"type": "function", "name": ""}], flat=True)


def test_tool_choice() -> None:
    assert choice_of(None, FUNCTIONS).mode == "auto"
    assert choice_of(None, []).mode == "none"
    assert choice_of("required", FUNCTIONS).forced
    named = choice_of({"type": "function", "function": {"name": "add"}}, FUNCTIONS)
    assert (named.mode, named.name) == ("function", "add")
    with pytest.raises(ToolError) as err:
        choice_of({"type": "function", "function": {"name": "sub"}}, FUNCTIONS)
    assert err.value.field == "tool_choice.function.name" and "'sub'" in str(err.value)
    with pytest.raises(ToolError, match="tool_choice"):
        choice_of("always", FUNCTIONS)
    with pytest.raises(ToolError, match="needs at least one tool"):
        choice_of("required", [])


def test_mistral_ids_are_what_its_template_accepts() -> None:
    ids = {new_call_id("mistral") for _ in range(20)}
    assert all(len(i) == 9 and i.isalnum() for i in ids) and len(ids) == 20
    assert new_call_id("hermes").startswith("call_")


@pytest.mark.parametrize("with_jsonschema", [True, False])
def test_arguments_are_checked_against_the_schema(monkeypatch: pytest.MonkeyPatch, with_jsonschema: bool) -> None:
    monkeypatch.setattr(schema_check, "HAS_JSONSCHEMA", with_jsonschema and schema_check.HAS_JSONSCHEMA)
    schema = LOOK["function"]["parameters"]
    assert schema_check.argument_problems({"key": "x", "tags": ["a"]}, schema) == []
    assert "key" in " ".join(schema_check.argument_problems({"tags": []}, schema))
    assert schema_check.argument_problems({"key": "z"}, schema)
    assert schema_check.argument_problems({"key": "x", "tags": [1]}, schema)
    with pytest.raises(ToolError, match="parameters.properties.key.type"):
        schema_check.check_schema({"type": "object", "properties": {"key": {"type": "str"}}}, "parameters")


def test_families_from_templates() -> None:
    assert family_of(templates.QWEN25) == "hermes"
    assert family_of(templates.LLAMA31) == "llama3"
    assert family_of(templates.MISTRAL_V03) == "mistral"
    assert family_of(templates.GEMMA2) == family_of(templates.PHI3) == family_of(None) == "generic"


CALL = {"name": "add", "arguments": {"a": 1, "b": 2}}
REPLIES = {
    "hermes": 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
              '<tool_call>\n{"name": "look_up", "arguments": {"key": "x"}}\n</tool_call>',
    "llama3": '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}; '
              '{"name": "look_up", "parameters": {"key": "x"}}',
    "mistral": '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "abcDEF123"}, '
               '{"name": "look_up", "arguments": {"key": "x"}, "id": "xyz987abc"}]',
    "generic": 'Sure.\n{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}, '
               '{"name": "look_up", "arguments": {"key": "x"}}]}',
}


@pytest.mark.parametrize("family", sorted(REPLIES))
def test_parallel_calls_parse_whole_and_streamed(family: str) -> None:
    text = REPLIES[family]
    parsed = parse_reply(family, text, FUNCTIONS)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("add", {"a": 1, "b": 2}),
                                                                        ("look_up", {"key": "x"})]
    assert parsed.content == ("Sure." if family in ("hermes", "generic") else None)
    if family == "mistral":
        assert [c.id for c in parsed.calls] == ["abcDEF123", "xyz987abc"]
    stream = CallStream(family, FUNCTIONS)
    sent = "".join(stream.push(text[i:i + 3]) for i in range(0, len(text), 3))
    rest, streamed = stream.finish()
    assert (sent + rest).strip() == (parsed.content or "")
    assert [(c.name, c.arguments) for c in streamed.calls] == [(c.name, c.arguments) for c in parsed.calls]


def test_text_streams_as_it_comes_and_bad_calls_stay_text() -> None:
    stream = CallStream("hermes", FUNCTIONS)
    assert stream.push("Hello <") == "Hello "  # "<" may open a call: held back
    assert stream.push("b>") == "<b>"
    rest, parsed = stream.finish()
    assert (rest, parsed.calls) == ("", [])
    bad = parse_reply("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": "one"}}\n</tool_call>', FUNCTIONS)
    assert bad.calls == [] and "do not validate" in (bad.problem or "") and bad.content
    unknown = parse_reply("hermes", '<tool_call>\n{"name": "sub", "arguments": {}}\n</tool_call>', FUNCTIONS)
    assert unknown.calls == [] and "'sub'" in (unknown.problem or "")
    cut = parse_reply("llama3", '{"name": "add", "parameters": {"a": 1', FUNCTIONS)
    assert cut.calls == [] and cut.content == '{"name": "add", "parameters": {"a": 1'


def test_generic_messages_describe_the_tools_and_write_the_turns() -> None:
    messages = [{"role": "user", "content": "1+2?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "3"}]
    out = generic_messages(messages, [ADD])
    assert out[0]["role"] == "system" and '"name": "add"' in out[0]["content"]
    assert json.loads(out[2]["content"]) == {"tool_calls": [CALL]}
    assert out[3] == {"role": "user", "content": '{"tool_call_id": "c1", "result": "3"}'}
    assert parse_reply("generic", out[2]["content"], FUNCTIONS).calls[0].name == "add"


def test_a_hermes_call_is_framed_as_the_models_own_template_frames_it(tmp_path) -> None:
    """Qwen 2.5 writes a newline inside the tags, the project's chat model none: a forced call is
    written the template's way, so the next turn's render of it is what the model produced."""
    from kvres.actors.chat_source import read_chat_template
    from kvres.actors.default_model import CHAT_MODEL
    from kvres.actors.tools.framing import QWEN_FRAMING, HermesFraming, hermes_framing
    from kvres.actors.tools.grammar import call_grammar
    from kvres.actors.tools.specs import functions_of
    from kvres.testing.family_models import write_family_gguf

    qwen = read_chat_template(write_family_gguf("qwen25", tmp_path / "qwen25.gguf"))
    assert qwen is not None and hermes_framing(qwen) == QWEN_FRAMING
    chat = read_chat_template(CHAT_MODEL)
    assert chat is not None
    tight = hermes_framing(chat)
    assert tight == HermesFraming("<tool_call>", "</tool_call>", "")
    functions = functions_of([{"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}])
    grammar = call_grammar("hermes", functions, parallel=True, framing=tight)
    assert grammar.startswith('root ::= "<tool_call>" kvres-tool-call "</tool_call>" ( "<tool_call>"'), grammar[:120]
