"""A reply sent back as the client got it is kept as the model wrote it: the next turn of a chat
appends only the new messages, on a SentencePiece model whose tokenizer puts a space after control
tokens (the shared stories260K with a Zephyr-style template: the log reads ``</s> \\n`` where the
rendering says ``</s>\\n``) and whose replies are rarely the tokens their text tokenizes to. Parked
between turns, the session comes back by import, nothing recomputed. On the real engine, without
Ray (the backend host)."""

from __future__ import annotations

import pytest

from benchmarks.chat_fleet.sides import with_chat_template
from benchmarks.realistic_model import CHAT_TEMPLATE
from kvres.actors.backend_setup.engine_registry import make_executor
from kvres.actors.config import BackendConfig
from kvres.actors.generation import GenerationRequest
from kvres.actors.host.backend import BackendHost
from kvres.actors.ray_actors.coldstore_actor import ColdStoreServer
from kvres.actors.sampling import SamplingParams
from kvres.testing import LocalStorePort

from ..conftest import shared_model_path

TEXT_ONLY = GenerationRequest(max_tokens=16, sampling=SamplingParams(temperature=0.0, grammar="root ::= [a-z ]+"),
                              ignore_eos=True)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> BackendHost:
    folder = tmp_path_factory.mktemp("round-trip")
    model = with_chat_template(shared_model_path(), folder / "stories-chat.gguf", CHAT_TEMPLATE)
    cfg = BackendConfig(name="round-trip", model_path=model, n_ctx=2048, n_seq_max=2, kv_budget_tokens=2048,
                        n_threads=1)
    store = ColdStoreServer(64 << 20, folder / "cold", 256 << 20)
    h = BackendHost(cfg, make_executor(cfg, model), store=LocalStorePort("n", {"n": store}))
    yield h
    h.shutdown()


def _word_in_two_pieces(host: BackendHost) -> tuple[str, list[int]]:
    """A word that reads, after other text, as one token with its leading space (`` park``), and two
    tokens that read the same (``▁pa`` ``rk``): a reply the model wrote otherwise than its text
    tokenizes back to."""
    bos = host.tokenize("", add_bos=True)[0]

    def in_context(tokens: list[int]) -> str:
        return host.detokenize([bos, *tokens])  # the BOS reads as nothing and keeps the space

    texts = {in_context([t]): t for t in range(host.executor.n_vocab)}
    for text in texts:
        if len(text) < 5 or text[0] != " " or not text[1:].isalpha():
            continue
        for k in range(2, len(text) - 1):
            left, right = texts.get(text[:k]), texts.get(text[k:])
            if left is not None and right is not None and in_context([left, right]) == text:
                return text, [left, right]
    raise AssertionError("the vocabulary has no word that two of its tokens also spell")


@pytest.mark.parametrize("parked", [False, True], ids=["live", "parked"])
def test_a_reply_in_other_tokens_than_its_text_is_kept(host: BackendHost, parked: bool) -> None:
    word, pieces = _word_in_two_pieces(host)
    sid = f"pieces-{parked}"
    host.open_session(sid)
    messages: list[dict[str, object]] = [{"role": "user", "content": "once upon a time there was a cat"}]
    host.append_messages(sid, messages)
    host.append(sid, pieces)  # the reply, as the model wrote it
    held = host.tokens(sid)
    messages += [{"role": "assistant", "content": word}, {"role": "user", "content": "the dog ran"}]
    if parked:
        host.suspend(sid)
    reply = host.chat(sid, messages, TEXT_ONLY)
    assert reply.prefix_break is None, reply.prefix_break
    log = host.tokens(sid)
    assert log[:len(held)] == held  # the reply's own tokens kept
    assert reply.prompt_tokens == len(log) - len(held) - len(reply)  # only the new messages prefilled
    assert host.session_stats(sid)["counters"]["recomputed_tokens"] == 0
    host.close(sid)


@pytest.mark.parametrize("parked", [False, True], ids=["live", "parked"])
def test_the_next_turn_appends_only_the_new_messages(host: BackendHost, parked: bool) -> None:
    sid = f"chat-{parked}"
    host.open_session(sid)
    messages: list[dict[str, object]] = [{"role": "user", "content": "once upon a time there was a cat"}]
    held: list[int] = []
    for words in ["the dog ran", "she said hi", "they went home", "the end"]:
        before = host.session_stats(sid)["counters"]
        reply = host.chat(sid, messages, TEXT_ONLY)
        assert reply.prefix_break is None, reply.prefix_break
        log = host.tokens(sid)
        assert log[:len(held)] == held  # the earlier replies' own tokens kept
        assert reply.prompt_tokens == len(log) - len(held) - len(reply)  # only the new messages prefilled
        assert host.session_stats(sid)["counters"]["recomputed_tokens"] == before["recomputed_tokens"]
        assert reply.text and log[-len(reply):] == list(reply)
        held = log
        messages += [{"role": "assistant", "content": reply.text}, {"role": "user", "content": words}]
        if parked:
            host.suspend(sid)
    host.close(sid)


def test_a_reply_sent_back_without_its_leading_space_cuts_a_parked_session_by_the_reply_only(host: BackendHost) -> None:
    """A client that strips the reply's text (many do) sends back a conversation the session does
    not hold from the reply on: the parked session is cut there and comes back by import, not by
    recomputing the whole conversation."""
    sid = "stripped"
    host.open_session(sid)
    messages: list[dict[str, object]] = [{"role": "user", "content": "once upon a time there was a cat"}]
    reply = host.chat(sid, messages, TEXT_ONLY)
    assert reply.text.startswith(" ")  # this model's replies begin with a space-marked token
    messages += [{"role": "assistant", "content": reply.text.strip()}, {"role": "user", "content": "the dog ran"}]
    host.suspend(sid)
    nxt = host.chat(sid, messages, TEXT_ONLY)
    assert nxt.prefix_break is not None
    counters = host.session_stats(sid)["counters"]
    assert counters["recomputed_tokens"] == 0 and counters["admissions"] >= 1, counters
    host.close(sid)
