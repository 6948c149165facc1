"""Tool calls over HTTP on models whose templates name a tool family (the random-weight fixtures of
``kvres.testing.family_models``: Qwen 2.5's Hermes ``<tool_call>`` form and Mistral v0.3's
``[TOOL_CALLS]``, a control token its reply text loses): a forced call parses and validates, whole
and streamed, and a tool round trip on a bound session reports no prefix break; a template that cannot render
tools (Gemma 2's: no system role for kvres's generic form) is a 400 that says so."""

from __future__ import annotations

import json
import secrets
import uuid

import pytest

from kvres.actors.tools.schema_check import argument_problems
from kvres.testing.family_models import write_family_gguf
from tests.serve.conftest import free_port, start_server, stop_server, wait_healthy

ADD_PARAMS = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "required": ["a", "b"]}
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Adds", "parameters": ADD_PARAMS}}]
FAMILIES = ("qwen25", "mistral_v03")
NO_SYSTEM = "gemma2"  # a template with no tools and no system role: it cannot render tools at all


@pytest.fixture(scope="module")
def family_server(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("families")
    backends = [{"name": name, "model_path": str(write_family_gguf(name, folder / f"{name}.gguf")), "n_ctx": 2048,
                 "n_seq_max": 4, "kv_budget_tokens": 2000, "n_threads": 1} for name in (*FAMILIES, NO_SYSTEM)]
    srv = start_server(folder, free_port(), key=f"test-key-{secrets.token_hex(16)}", backends=backends, replicas=1)
    wait_healthy(srv)
    yield srv
    stop_server(srv)


@pytest.mark.parametrize("model", FAMILIES)
def test_forced_calls_parse_and_a_round_trip_keeps_the_session(family_server, model: str) -> None:
    client = family_server.client()
    session = {"X-Session-Id": f"fam-{uuid.uuid4().hex[:8]}"}
    messages = [{"role": "user", "content": "Add 2 and 3."}]
    kwargs = {"model": model, "tools": TOOLS, "max_tokens": 300, "temperature": 1.0, "seed": 3,
              "tool_choice": {"type": "function", "function": {"name": "add"}}}
    whole = client.chat.completions.create(messages=messages, extra_headers=session, **kwargs)
    assert whole.choices[0].finish_reason == "tool_calls", whole.choices[0]
    call = whole.choices[0].message.tool_calls[0]
    assert call.function.name == "add" and argument_problems(json.loads(call.function.arguments), ADD_PARAMS) == []
    if model == "mistral_v03":
        assert len(call.id) == 9 and call.id.isalnum()  # the id the model wrote, as its template wants it

    streamed: dict[str, str] = {"name": "", "arguments": ""}
    finish = None
    for chunk in client.chat.completions.create(messages=messages, stream=True, **kwargs):
        for part in (chunk.choices[0].delta.tool_calls or ()) if chunk.choices else ():
            streamed["name"] += part.function.name or ""
            streamed["arguments"] += part.function.arguments or ""
        finish = (chunk.choices[0].finish_reason if chunk.choices else None) or finish
    assert finish == "tool_calls" and streamed["name"] == "add"
    assert argument_problems(json.loads(streamed["arguments"]), ADD_PARAMS) == []

    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "5"}]
    after = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice="none",
                                           max_tokens=4, temperature=0.0, extra_headers=session)
    assert after.model_extra["kvres"]["prefix_break"] is None, after.model_extra["kvres"]
    assert after.usage.prompt_tokens_details.cached_tokens >= whole.usage.prompt_tokens + whole.usage.completion_tokens


def test_a_template_that_cannot_render_tools_is_a_400(family_server) -> None:
    import openai

    client = family_server.client()
    with pytest.raises(openai.BadRequestError, match="cannot render these tools.*System role not supported"):
        client.chat.completions.create(model=NO_SYSTEM, messages=[{"role": "user", "content": "hi"}], tools=TOOLS,
                                       max_tokens=4)
    plain = client.chat.completions.create(model=NO_SYSTEM, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert plain.choices[0].finish_reason in ("stop", "length")
