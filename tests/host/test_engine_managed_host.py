"""A host whose engine manages its KV itself (openvino-genai, stories260K): each call runs whole, a
generate's prompt is appended first, a suspended session parks its log only and its next call
brings it back; what needs kvres to address the KV (an evicting policy, a handed-over record with
resident KV to restore) is refused with a typed error, and the refused session is not left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.actors.generation import GenerationRequest
from kvres.actors.host.backend import BackendHost
from kvres.actors.host.journal import SessionRecord
from kvres.actors.metrics import COUNTERS
from kvres.policy import KvresError, Range
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
