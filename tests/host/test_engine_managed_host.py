"""A host whose engine manages its KV itself (openvino-genai, stories260K): each call runs whole, a
generate's prompt is appended first, a suspended session parks its log only and its next call
brings it back; what needs kvres to address the KV (an evicting policy, a handed-over record with
resident KV to restore) is refused with a typed error, and the refused session is not left behind.
Budgets hold as on the other engines: a prompt past a session's context limit (the KV budget for
kind "none"; the engine's KV pool, which each request fills with the whole log, for kind "engine"
too) is refused before any of it goes in, and a generate stops there with finish_reason "length"."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.actors.engines.openvino.genai_executor import GenAIExecutor
from kvres.actors.generation import GenerationRequest
from kvres.actors.host.backend import BackendHost
from kvres.actors.host.journal import SessionRecord
from kvres.actors.metrics import COUNTERS
from kvres.policy import ContextLengthError, KvresError, Range
from tests.conftest import local_host

PROMPT = [1] + [3 + (i * 37) % 490 for i in range(40)]


def genai_host(model: Path, cold_dir: Path) -> BackendHost:
    config = BackendConfig(name="genai", engine="openvino-genai", model_path=model, n_ctx=1024,
                           kv_budget_tokens=1000, n_threads=1)
    host: BackendHost = local_host(config, cold_dir)
    return host


def test_calls_run_whole_and_a_parked_session_comes_back(stories_model: Path, tmp_path: Path) -> None:
    h = genai_host(stories_model, tmp_path)
    h.open_session("s")
    answer = h.generate("s", GenerationRequest(max_tokens=6, ignore_eos=True), prompt=PROMPT)
    assert answer.prompt_tokens == len(PROMPT) and len(answer) == 6
    assert h.token_count("s") == len(PROMPT) + 6
    record = h.suspend("s")
    assert record.blocks == [] and record.resident_ranges == []  # nothing of its KV leaves the engine
    assert len(h.generate("s", GenerationRequest(max_tokens=4, ignore_eos=True))) == 4  # resumed first
    assert h.session_stats("s")["state"] == "live"


def test_what_needs_kvres_to_address_the_kv_is_refused(stories_model: Path, tmp_path: Path) -> None:
    h = genai_host(stories_model, tmp_path)
    with pytest.raises(ValueError, match="whose KV kvres cannot address"):
        h.open_session("evicting", SessionPolicy.streaming(128, recent_tokens=32))
    moved = SessionRecord("moved", list(PROMPT), [Range(0, len(PROMPT))], [], [], SessionPolicy(), None,
                          dict.fromkeys(COUNTERS, 0), h.fingerprint)
    with pytest.raises(KvresError, match=r"backend 'genai' \(openvino-genai\) cannot resume: the engine manages its KV"):
        h.resume("moved", moved)
    assert h.sessions() == []


def _tokens(n: int, start: int = 0) -> list[int]:
    return [3 + (start + i) % 400 for i in range(n)]


def _stops_at(h: BackendHost, session_id: str, limit: int) -> None:
    """A generate ends where the session holds its limit ("length"); one there ends at once."""
    held = h.token_count(session_id)
    reply = h.generate(session_id, GenerationRequest(max_tokens=300, ignore_eos=True))
    assert reply.finish_reason == "length" and len(reply) == limit - held
    nothing = h.generate(session_id, GenerationRequest(max_tokens=10, ignore_eos=True))
    assert list(nothing) == [] and nothing.finish_reason == "length" and h.token_count(session_id) == limit


def test_a_session_that_keeps_every_token_stops_at_the_kv_budget(stories_model: Path, tmp_path: Path) -> None:
    config = BackendConfig(name="genai", engine="openvino-genai", model_path=stories_model, n_ctx=1024,
                           kv_budget_tokens=500, n_threads=1)
    h: BackendHost = local_host(config, tmp_path)
    h.open_session("s")
    h.append("s", _tokens(400))
    with pytest.raises(ContextLengthError, match=(
            r"^session 's' holds 400 tokens and the call brings 150 more: 550 is past the 500 tokens one session "
            r"can hold on backend 'genai' \(kv_budget_tokens=500\) with a policy that keeps every token resident; "
            r"nothing was appended\. Roll the session back or start a new one, or open it with a policy the engine "
            r"evicts by \(SessionPolicy kind 'engine', up to 8192 tokens\)$")):
        h.append("s", _tokens(150, 400))
    with pytest.raises(ContextLengthError, match="550 is past the 500 tokens"):  # a prompt given with the generate
        h.generate("s", GenerationRequest(max_tokens=5, ignore_eos=True), prompt=_tokens(150, 400))
    assert h.tokens("s") == _tokens(400)  # nothing of either was appended
    _stops_at(h, "s", 500)


def test_the_engines_kv_pool_bounds_a_session_the_engine_evicts_in(stories_model: Path) -> None:
    """genai evicts only as it generates: each request prefills the session's whole log, which must
    fit its KV pool (here 16 blocks of 32 cells), or genai answers with no tokens and no error."""
    config = BackendConfig(name="genai", engine="openvino-genai", model_path=stories_model, n_ctx=1024,
                           kv_budget_tokens=1000, n_threads=1)
    h = BackendHost(config, GenAIExecutor(stories_model, num_threads=1, kv_blocks=16))
    try:
        h.open_session("evicting", SessionPolicy.engine_evicts(96, recent_tokens=32))
        h.open_session("plain")
        for sid in ("evicting", "plain"):
            h.append(sid, _tokens(400))
        pool = (r"\(the openvino-genai KV pool of 512 cells, which each request fills with the session's whole "
                r"log\)")
        with pytest.raises(ContextLengthError, match=(
                r"holds 400 tokens and the call brings 150 more: 550 is past the 512 tokens one session can hold on "
                rf"backend 'genai' {pool} with a policy the engine evicts by, which it does only as it generates; "
                r"nothing was appended\. Roll the session back or start a new one$")):
            h.append("evicting", _tokens(150, 400))
        with pytest.raises(ContextLengthError, match=rf"550 is past the 512 tokens .* {pool} with a policy that "
                                                     "keeps every token resident"):
            h.append("plain", _tokens(150, 400))
        for sid in ("evicting", "plain"):
            assert h.tokens(sid) == _tokens(400)
            _stops_at(h, sid, 512)
    finally:
        h.shutdown()
