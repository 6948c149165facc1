"""Tool calling over HTTP with the real ``openai`` client against ``kvres serve``: ``tool_choice``
required / named forces a call that parses and validates (the grammar does it, on any model),
whole and streamed on both APIs; a tool round trip on a bound session or a Responses chain
appends only the new turns; malformed tools, choices, calls and tool messages are 400s naming the
field."""

from __future__ import annotations

import json
import uuid

import openai
import pytest

from kvres.actors.tools.schema_check import argument_problems

ADD_PARAMS = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "required": ["a", "b"]}
PICK_PARAMS = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green"]}},
               "required": ["colour"]}
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Adds two integers", "parameters": ADD_PARAMS}},
         {"type": "function", "function": {"name": "pick", "description": "Picks a colour", "parameters": PICK_PARAMS}}]
FLAT_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
SCHEMAS = {"add": ADD_PARAMS, "pick": PICK_PARAMS}
USER = [{"role": "user", "content": "What is 2 plus 3?"}]


def _valid(name: str, arguments: str) -> None:
    assert name in SCHEMAS
    assert argument_problems(json.loads(arguments), SCHEMAS[name]) == [], arguments


def test_a_named_or_required_choice_always_calls(server) -> None:
    client = server.client()
    for choice, names in [({"type": "function", "function": {"name": "add"}}, {"add"}),
                          ({"type": "function", "function": {"name": "pick"}}, {"pick"}),
                          ("required", {"add", "pick"})]:
        for seed in range(2):
            r = client.chat.completions.create(model=server.model, messages=USER, tools=TOOLS, tool_choice=choice,
                                               seed=seed, temperature=1.0, max_tokens=800)
            choice0 = r.choices[0]
            assert choice0.finish_reason == "tool_calls", choice0
            calls = choice0.message.tool_calls
            assert calls and {c.function.name for c in calls} <= names
            for call in calls:
                assert call.id and call.type == "function"
                _valid(call.function.name, call.function.arguments)


def test_streamed_tool_calls_assemble_like_the_whole_answer(server) -> None:
    client = server.client()
    kwargs = {"model": server.model, "messages": USER, "tools": TOOLS, "max_tokens": 200, "seed": 7,
              "tool_choice": {"type": "function", "function": {"name": "add"}}, "temperature": 0.0}
    whole = client.chat.completions.create(**kwargs).choices[0]
    calls: dict[int, dict[str, str]] = {}
    finish, content = None, ""
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for part in delta.tool_calls or ():
            call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += part.id or ""
            call["name"] += (part.function.name or "") if part.function else ""
            call["arguments"] += (part.function.arguments or "") if part.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and content.strip() == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        (c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls or ()]


def test_a_tool_round_trip_on_a_bound_session_appends_only_the_new_turns(server) -> None:
    client = server.client()
    session = {"X-Session-Id": f"tools-{uuid.uuid4().hex[:8]}"}
    first = client.chat.completions.create(model=server.model, messages=USER, tools=TOOLS, max_tokens=200,
                                           tool_choice={"type": "function", "function": {"name": "add"}},
                                           temperature=0.0, extra_headers=session)
    call = first.choices[0].message.tool_calls[0]
    history = [*USER, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": "5"}]
    second = client.chat.completions.create(model=server.model, messages=history, tools=TOOLS, tool_choice="none",
                                            max_tokens=16, temperature=0.0, extra_headers=session)
    assert second.choices[0].finish_reason in ("stop", "length")
    assert second.choices[0].message.tool_calls is None
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens


def test_responses_function_calls_chain_through_previous_response_id(server) -> None:
    client = server.client()
    first = client.responses.create(model=server.model, input="What is 2 plus 3?", tools=FLAT_TOOLS,
                                    tool_choice={"type": "function", "name": "add"}, max_output_tokens=200,
                                    temperature=0.0)
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and calls[0].name == "add" and calls[0].call_id
    _valid(calls[0].name, calls[0].arguments)
    second = client.responses.create(model=server.model, previous_response_id=first.id, tools=FLAT_TOOLS,
                                     input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                             "output": "5"}], max_output_tokens=16, temperature=0.0)
    assert second.output and second.output[0].type == "message"
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens + first.usage.output_tokens - 2
    items = client.responses.input_items.list(second.id).data
    assert [i.type for i in items] == ["function_call_output"]
    # streamed: the call comes as a function_call item with its argument events
    events = list(client.responses.create(model=server.model, input="Pick one.", tools=FLAT_TOOLS,
                                          tool_choice={"type": "function", "name": "pick"}, max_output_tokens=200,
                                          stream=True))
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert "response.output_text.delta" not in kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    _valid("pick", done.arguments)
    final = events[-1].response
    assert events[-1].type == "response.completed" and final.output[-1].type == "function_call"
    assert final.output[-1].arguments == done.arguments
    # tools offered, the reply text (tool_choice auto): the message opens with its first text, as without tools
    events = list(client.responses.create(model=server.model, input="Say hello.", tools=FLAT_TOOLS, tool_choice="auto",
                                          max_output_tokens=12, temperature=0.0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds.index("response.output_item.added") < kinds.index("response.content_part.added") < \
        kinds.index("response.output_text.delta") < kinds.index("response.output_text.done")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output[0].type == "message" and final.output[0].content[0].text == text
    assert [e.sequence_number for e in events] == list(range(len(events)))


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": 3}}}]},
     "tools[0].function.parameters.required"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "sub"}}}, "tool_choice.function.name"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "grammar": "root ::= \"x\""}, "tool_choice"),
    ({"messages": [*USER, {"role": "tool", "tool_call_id": "nope", "content": "5"}]}, "messages.1.tool_call_id"),
    ({"messages": [*USER, {"role": "tool", "content": "5"}]}, "messages.1"),
    ({"messages": [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{not json"}}]}]},
     "messages.1.tool_calls.0.function.arguments"),
])
def test_malformed_tool_requests_are_400s_naming_the_field(server, body: dict, param: str) -> None:
    client = server.client()
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=server.model, messages=body.get("messages", USER), max_tokens=4,
                                       extra_body={k: v for k, v in body.items() if k != "messages"})
    assert bad.value.body["param"] == param, bad.value.body
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model=server.model, input=[
            {"type": "function_call_output", "call_id": "nope", "output": "5"}])
    assert bad.value.body["param"] == "input[0].call_id"
