"""Why a turn was not cached: a chat turn whose conversation was edited at message k reports k, the
token position where the session's log and the new rendering part, and the text on each side; an
unedited conversation, a chain of tool turns included, reports none. On the real engine and the
default model's own template, without Ray (the backend host)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvres.actors.backend_setup.engine_registry import make_executor
from kvres.actors.chat_source import read_chat_template
from kvres.actors.config import BackendConfig
from kvres.actors.default_model import default_model_path
from kvres.actors.generation import Generation, GenerationRequest
from kvres.actors.host.backend import BackendHost
from kvres.actors.ray_actors.coldstore_actor import ColdStoreServer
from kvres.actors.sampling import SamplingParams
from kvres.actors.tools.families import family_of
from kvres.actors.tools.framing import QWEN_FRAMING, hermes_framing
from kvres.actors.tools.grammar import call_grammar
from kvres.actors.tools.parsing import parse_reply
from kvres.actors.tools.specs import functions_of
from kvres.testing import LocalStorePort

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Adds two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> BackendHost:
    model = Path(default_model_path())
    cfg = BackendConfig(name="breaks", model_path=model, n_ctx=4096, n_seq_max=2, kv_budget_tokens=4000, n_threads=1)
    store = ColdStoreServer(64 << 20, tmp_path_factory.mktemp("cold"), 256 << 20)
    h = BackendHost(cfg, make_executor(cfg, model), store=LocalStorePort("n", {"n": store}))
    yield h
    h.shutdown()


def test_an_edited_history_reports_the_message_and_the_token(host: BackendHost) -> None:
    host.open_session("edit")
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"}]
    first = host.chat("edit", messages, 12)
    assert first.prefix_break is None
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And of Spain?"}]
    second = host.chat("edit", messages, 12)
    assert second.prefix_break is None
    held = host.tokens("edit")
    messages += [{"role": "assistant", "content": second.text}, {"role": "user", "content": "Thanks."}]

    edited = [dict(m) for m in messages]
    edited[2] = {"role": "assistant", "content": "Paris is the capital."}  # the reply rewritten by the client
    third = host.chat("edit", edited, 4)
    pb = third.prefix_break
    assert pb is not None and pb["message"] == 2, pb
    assert pb["token"] == third.length - len(third) - third.prompt_tokens  # kept up to there, prefilled after
    assert 0 < pb["token"] < len(held)
    assert pb["now"].startswith("Paris is the capital.") and pb["held"].startswith(first.text)
    assert pb["before"].endswith("<|assistant|>\n")

    edited[0] = {"role": "system", "content": "You are terse."}  # the system prompt edited
    fourth = host.chat("edit", edited, 4)
    assert fourth.prefix_break is not None and fourth.prefix_break["message"] == 0
    assert fourth.prefix_break["token"] < pb["token"]
    assert fourth.prefix_break["now"].startswith("terse.") and fourth.prefix_break["held"].startswith("a helpful")
    host.close("edit")


def test_an_unedited_chain_of_ten_tool_turns_reports_none(host: BackendHost) -> None:
    source = read_chat_template(default_model_path())
    assert source is not None
    family = family_of(source.template)  # the default model's own call form (hermes since its retraining)
    functions = functions_of(TOOLS)
    grammar = call_grammar(family, functions, framing=hermes_framing(source) if family == "hermes" else QWEN_FRAMING)
    host.open_session("tools")
    messages: list[dict[str, object]] = [{"role": "user", "content": "Add some numbers for me.", "tools": TOOLS}]
    cached_all = True
    for turn in range(10):
        request = GenerationRequest(max_tokens=200, sampling=SamplingParams(temperature=1.0, seed=turn, grammar=grammar))
        before = len(host.tokens("tools"))
        reply = host.chat("tools", messages, request)
        assert reply.prefix_break is None, (turn, reply.prefix_break)
        cached_all &= reply.length - len(reply) - reply.prompt_tokens >= before
        call = parse_reply(family, reply.text or "", functions).calls[0]
        messages += [{"role": "assistant", "content": None, "tool_calls": [call.as_chat()]},
                     {"role": "tool", "tool_call_id": call.id, "content": str(sum(call.argument_values().values()))}]
    assert cached_all
    host.close("tools")


def _word_written_otherwise(host: BackendHost) -> tuple[str, list[int]]:
    """A word the tokenizer reads as one token, written as two tokens that read the same (as a
    model's sampling often writes a word)."""
    for token in range(host.executor.n_vocab):
        word = host.detokenize([token])
        if len(word) < 4 or not word.isalpha() or host.tokenize(word, add_bos=False) != [token]:
            continue
        pieces = host.tokenize(word[:2], add_bos=False) + host.tokenize(word[2:], add_bos=False)
        if host.detokenize(pieces) == word and pieces != [token]:
            return word, pieces
    raise AssertionError("the model's vocabulary has no word that two of its tokens also spell")


def test_a_turn_the_client_never_saw_is_dropped_and_the_replies_before_it_kept(host: BackendHost) -> None:
    """A try cut on its way back (its front died) ran on: the log holds its prompt and its reply,
    which the retry's conversation does not. The retry keeps everything before that reply, earlier
    replies written in tokens their text does not tokenize back to included, and prefills nothing."""
    word, pieces = _word_written_otherwise(host)
    host.open_session("unseen")
    messages: list[dict[str, object]] = [{"role": "user", "content": "Say a word."}]
    host.append_messages("unseen", messages)
    host.append("unseen", pieces)  # the reply, as the model wrote it
    host.close_reply("unseen", messages, Generation(pieces, "eos", None, word))
    messages += [{"role": "assistant", "content": word}, {"role": "user", "content": "Another one."}]
    host.append_messages("unseen", messages)
    seen = host.tokens("unseen")
    assert pieces == seen[seen.index(pieces[0]):][:len(pieces)]  # the reply's tokens are in the log as written
    host.generate("unseen", GenerationRequest(max_tokens=3, ignore_eos=True))  # unseen
    assert len(host.tokens("unseen")) == len(seen) + 3

    retry = host.chat("unseen", messages, 4)
    assert retry.prompt_tokens == 0  # nothing prefilled: the log held the whole conversation
    assert host.tokens("unseen")[:len(seen)] == seen
    assert retry.prefix_break is not None and retry.prefix_break["token"] == len(seen)
    assert retry.prefix_break["message"] == len(messages)  # past every message: the log held more
    host.close("unseen")


def test_a_parked_session_reports_the_break_of_the_turn_that_brings_it_back(host: BackendHost) -> None:
    """The turn that resumes a suspended session (a fleet parks idle sessions for others' room)
    still says where its conversation left the log."""
    host.open_session("parked")
    messages: list[dict[str, object]] = [{"role": "user", "content": "What is the capital of France?"}]
    first = host.chat("parked", messages, 8)
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And of Spain?"}]
    host.chat("parked", messages, 4)
    edited = [dict(m) for m in messages]
    edited[1] = {"role": "assistant", "content": "Paris."}  # the reply rewritten by the client
    host.suspend("parked")
    reply = host.chat("parked", edited, 4)
    assert reply.prefix_break is not None and reply.prefix_break["message"] == 1, reply.prefix_break
    host.close("parked")
