"""LangChain's ``ChatOpenAI.bind_tools`` against ``kvres serve``: the call comes back parsed in
``AIMessage.tool_calls`` (a forced choice: the grammar makes any model call), the tool's result
goes back as a ``ToolMessage`` and the model answers in text; streamed, the call's chunks assemble
the same way."""

from __future__ import annotations

import pytest

langchain_openai = pytest.importorskip("langchain_openai")


def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


def test_bind_tools_round_trip(server) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage

    llm = langchain_openai.ChatOpenAI(base_url=server.v1, api_key=server.key, model=server.model, temperature=0,
                                      max_tokens=200, max_retries=0, timeout=120)
    forced = llm.bind_tools([add], tool_choice="add")
    question = HumanMessage("What is 2 plus 3?")
    reply = forced.invoke([question])
    assert reply.tool_calls and reply.tool_calls[0]["name"] == "add"
    args = reply.tool_calls[0]["args"]
    assert set(args) == {"a", "b"} and all(isinstance(v, int) for v in args.values())

    streamed = None
    for chunk in forced.stream([question]):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed is not None and [c["name"] for c in streamed.tool_calls] == ["add"]
    assert streamed.tool_calls[0]["args"] == args  # temperature 0: the same call

    result = ToolMessage(str(add(**args)), tool_call_id=reply.tool_calls[0]["id"])
    answer = llm.bind_tools([add], tool_choice="none").invoke([question, reply, result])
    assert not answer.tool_calls and isinstance(answer.content, str)
