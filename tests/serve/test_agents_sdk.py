"""The real ``openai-agents`` package runs an agent with two ``function_tool``s against ``kvres
serve`` on the default model, over chat completions and over Responses: the SDK's loop sends the
tools, kvres returns the model's call parsed, the SDK runs the tool and sends its result back, and
the model answers with it. "what is the value of apple?" takes one call; "add the values of apple and tree"
three (two lookups, then the add on their results)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

agents = pytest.importorskip("agents")

VALUES = {"apple": 12, "tree": 7}


def _agent(server: Any, api: str, calls: list[tuple[str, dict[str, Any]]]) -> Any:
    from openai import AsyncOpenAI

    @agents.function_tool
    def lookup(key: str) -> int:
        """Looks up the value of a key."""
        calls.append(("lookup", {"key": key}))
        return VALUES.get(key, 0)

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """Adds two integers."""
        calls.append(("add", {"a": a, "b": b}))
        return a + b

    client = AsyncOpenAI(base_url=server.v1, api_key=server.key, max_retries=0, timeout=120)
    model: Any
    if api == "chat":
        model = agents.OpenAIChatCompletionsModel(model=server.model, openai_client=client)
    else:
        model = agents.OpenAIResponsesModel(model=server.model, openai_client=client)
    settings = agents.ModelSettings(temperature=0, max_tokens=64)
    return agents.Agent(name="calculator", instructions="you are a helpful assistant.",
                        tools=[lookup, add], model=model, model_settings=settings)


def _run(server: Any, api: str, task: str, max_turns: int) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    """The agent's loop on ``task``: the tool calls it ran, and its final answer."""
    agents.set_tracing_disabled(True)
    calls: list[tuple[str, dict[str, Any]]] = []
    result = asyncio.run(agents.Runner.run(_agent(server, api, calls), task, max_turns=max_turns))
    return calls, str(result.final_output)


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_an_agent_calls_a_tool_and_answers_with_its_result(server, api: str) -> None:
    calls, answer = _run(server, api, "what is the value of apple?", max_turns=4)
    assert calls == [("lookup", {"key": "apple"})], calls
    assert answer.strip() == "12.", (answer, calls)


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_an_agent_looks_up_two_values_and_adds_them(server, api: str) -> None:
    calls, answer = _run(server, api, "add the values of apple and tree.", max_turns=6)
    assert sorted(call["key"] for name, call in calls if name == "lookup") == ["apple", "tree"], calls
    assert ("add", {"a": 12, "b": 7}) in calls or ("add", {"a": 7, "b": 12}) in calls, calls
    assert "19" in answer, (answer, calls)
