"""Tool calls through each family's own chat template (the fixtures of ``kvres.testing.family_models``):
a call the template wrote is read back exactly (arguments included), single and parallel, whole
and streamed token by token through the family's llama.cpp vocabulary; a forced call on a
random-weight model always parses and validates (the grammar does it); a template that cannot
render tools is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvres.actors.chat_source import read_chat_template
from kvres.actors.tools.families import family_of
from kvres.actors.tools.parsing import CallStream, parse_reply
from kvres.actors.tools.rendering import ToolTemplateError, render_conversation
from kvres.actors.tools.specs import functions_of, new_call_id
from kvres.testing.family_models import FAMILY_SPECS, write_family_gguf

ADD = {"type": "function", "function": {"name": "add", "description": "Adds two numbers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
LOOK = {"type": "function", "function": {"name": "look_up", "description": "Finds a word", "parameters": {
    "type": "object", "properties": {"word": {"type": "string"}, "lang": {"type": "string", "enum": ["en", "fr"]}},
    "required": ["word"]}}}
TOOLS = [ADD, LOOK]
FUNCTIONS = functions_of(TOOLS)
TOOL_FAMILIES = {"qwen25": "hermes", "llama31": "llama3", "mistral_v03": "mistral", "phi3": "generic"}
END_OF_TURN = {"qwen25": "<|im_end|>", "llama31": "<|eot_id|>", "mistral_v03": "</s>", "phi3": "<|end|>"}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("families")
    return {name: write_family_gguf(name, folder / f"{name}.gguf") for name in FAMILY_SPECS}


def _calls(family: str, n: int) -> list[dict[str, object]]:
    arguments = [{"a": 12, "b": -3}, {"word": "caf\u00e9 \"au\" lait", "lang": "fr"}]
    names = ["add", "look_up"]
    return [{"id": new_call_id(family), "type": "function",
             "function": {"name": names[i], "arguments": json.dumps(arguments[i])}} for i in range(n)]


def _written_reply(source: object, family: str, model: str, n: int) -> tuple[list[dict[str, object]], str]:
    """The calls and the text the template writes for them after the generation prompt, up to the
    end of the turn: what a model that made these calls generated."""
    # no system message: Mistral v0.3's template writes it into the last user turn only
    messages: list[dict[str, object]] = [{"role": "user", "content": "What is 12 + -3, and caf\u00e9?", "tools": TOOLS}]
    calls = _calls(family, n)
    prompt = render_conversation(source, messages)  # type: ignore[arg-type]
    whole = render_conversation(source, [*messages, {"role": "assistant", "content": None, "tool_calls": calls}],  # type: ignore[arg-type]
                                add_generation_prompt=False)
    assert whole.startswith(prompt), "the template's generation prompt opens its assistant turn"
    reply = whole[len(prompt):]
    return calls, reply[:reply.index(END_OF_TURN[model])]


def _read_back(calls: list[dict[str, object]], parsed: list[object]) -> None:
    assert [(c.name, json.loads(c.arguments)) for c in parsed] == [  # type: ignore[attr-defined]
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]  # type: ignore[index]


@pytest.mark.parametrize("n", [1, 2], ids=["single", "parallel"])
@pytest.mark.parametrize("model", sorted(TOOL_FAMILIES))
def test_a_call_the_template_wrote_is_read_back(models: dict[str, Path], model: str, n: int) -> None:
    import llama_cpp

    source = read_chat_template(models[model])
    assert source is not None
    family = family_of(source.template)
    assert family == TOOL_FAMILIES[model]
    if model == "llama31" and n == 2:
        with pytest.raises(ToolTemplateError, match="single tool-calls"):
            _written_reply(source, family, model, n)
        return
    calls, text = _written_reply(source, family, model, n)
    parsed = parse_reply(family, text, FUNCTIONS)
    _read_back(calls, parsed.calls)
    if family == "mistral":
        assert [c.id for c in parsed.calls] == [c["id"] for c in calls]
    # streamed: the reply's tokens in the family's vocabulary, decoded one by one as a server sends them
    vocab = llama_cpp.Llama(str(models[model]), vocab_only=True, verbose=False)
    tokens = vocab.tokenize(text.encode(), add_bos=False, special=True)
    stream, sent, raw = CallStream(family, FUNCTIONS), "", b""
    for token in tokens:
        raw += vocab.detokenize([token], special=True)
        try:
            piece = raw.decode()
        except UnicodeDecodeError:
            continue
        raw = b""
        sent += stream.push(piece)
    rest, streamed = stream.finish()
    _read_back(calls, streamed.calls)
    assert (sent + rest).strip() == ""


def test_tool_results_render_in_each_family(models: dict[str, Path]) -> None:
    for model, family in TOOL_FAMILIES.items():
        source = read_chat_template(models[model])
        assert source is not None
        calls = _calls(family, 1)
        text = render_conversation(source, [
            {"role": "user", "content": "12 + -3?", "tools": TOOLS},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": "9"},
        ])
        assert "9" in text.split("12 + -3?")[-1], (model, text)


def test_a_template_that_cannot_render_tools_says_so(models: dict[str, Path]) -> None:
    source = read_chat_template(models["gemma2"])
    assert source is not None
    plain = render_conversation(source, [{"role": "user", "content": "hi"}])
    assert plain.endswith("<start_of_turn>model\n")
    with pytest.raises(ToolTemplateError, match="cannot render these tools.*System role not supported"):
        render_conversation(source, [{"role": "user", "content": "hi", "tools": TOOLS}])


PICK = {"type": "function", "function": {"name": "pick", "parameters": {
    "type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green"]}, "n": {"type": "integer"}},
    "required": ["colour"]}}}


@pytest.mark.parametrize("model", sorted(TOOL_FAMILIES))
def test_a_forced_call_on_random_weights_always_parses(models: dict[str, Path], model: str, tmp_path: Path) -> None:
    """The grammar of ``tool_choice`` required / named on the real engine: whatever the random
    weights prefer, each sampled reply is a call (two where parallel) that parses and validates."""
    import llama_cpp

    from kvres.actors.backend_setup.engine_registry import make_executor
    from kvres.actors.config import BackendConfig
    from kvres.actors.generation import GenerationRequest
    from kvres.actors.host.backend import BackendHost
    from kvres.actors.sampling import SamplingParams
    from kvres.actors.tools.grammar import call_grammar

    tools = [ADD, PICK]  # bounded arguments: integers and enums (a random model's free string may never end)
    functions = functions_of(tools)
    source = read_chat_template(models[model])
    assert source is not None
    family = family_of(source.template)
    cfg = BackendConfig(name=f"f-{model}", model_path=models[model], n_ctx=2048, n_seq_max=2, kv_budget_tokens=2000,
                        n_threads=1)
    host = BackendHost(cfg, make_executor(cfg, models[model]))
    vocab = llama_cpp.Llama(str(models[model]), vocab_only=True, verbose=False)
    try:
        for seed, (offered, parallel) in enumerate([(functions, False), (functions[1:], False), (functions, True)]):
            grammar = call_grammar(family, offered, parallel=parallel and family != "llama3")
            session = f"s{seed}"
            host.open_session(session)
            request = GenerationRequest(max_tokens=600, sampling=SamplingParams(temperature=1.0, seed=seed,
                                                                                grammar=grammar))
            reply = host.chat(session, [{"role": "user", "content": "Call a tool.", "tools": tools}], request)
            assert reply.finish_reason == "eos", (reply.finish_reason, reply.text)
            parsed = parse_reply(family, reply.text or "", functions)
            assert parsed.calls, (parsed.problem, reply.text)
            assert {c.name for c in parsed.calls} <= {f.name for f in offered}
            # the call reads as the template renders it next turn: the session keeps it
            asked = [{"role": "user", "content": "Call a tool.", "tools": tools}]
            answered = [*asked, {"role": "assistant", "content": parsed.content,
                                 "tool_calls": [c.as_chat() for c in parsed.calls]}]
            said = vocab.detokenize(list(reply)[:-1], special=True).decode()  # control tokens kept, EOS not
            assert render_conversation(source, answered, add_generation_prompt=False).startswith(
                render_conversation(source, asked) + said)
            host.close(session)
    finally:
        host.shutdown()
