"""A backend's ``stats()["loop"]`` says where its step loop's time went, on the real llama.cpp
engine (stories260K): every token the engine decoded is counted once, the engine's seconds lie
inside the steps' seconds, and a call refused before the engine adds none."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvres.actors.config import BackendConfig
from kvres.actors.host.backend import BackendHost
from kvres.actors.host.scheduler import LoopProfile
from kvres.policy import KvresError
from tests.conftest import local_host, shared_model_path

PROMPT = [3 + (7 * i) % 200 for i in range(40)]


def make_host(tmp_path: Path) -> BackendHost:
    config = BackendConfig(name="profile", model_path=shared_model_path(), n_ctx=512, n_seq_max=4,
                           kv_budget_tokens=400, n_threads=1)
    return local_host(config, tmp_path / "cold")


def test_the_loop_profile_counts_every_decoded_token_once(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    assert host.stats()["loop"] == {"steps": 0, "step_s": 0.0, "engine_s": 0.0, "engine_tokens": 0,
                                      "commit_s": 0.0}
    host.open_session("a")
    host.open_session("b")
    host.append("a", PROMPT)
    host.append("b", PROMPT[:10])
    host.generate("a", 5)  # the first token comes from the append's logits: 4 more decoded, then the last
    loop = host.stats()["loop"]
    assert loop["engine_tokens"] == len(PROMPT) + 10 + 5
    assert loop["steps"] >= 3 and 0 < loop["engine_s"] <= loop["step_s"]
    assert loop["commit_s"] > 0  # each call's record was written before its answer


def test_a_call_the_engine_refuses_adds_no_tokens(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    host.open_session("a")
    with pytest.raises(KvresError):
        host.append("a", [10**9])  # not a token id of the model: refused before the engine decodes
    assert host.stats()["loop"]["engine_tokens"] == 0


def test_loop_profile_adds_up() -> None:
    profile = LoopProfile()
    profile.engine(0.5, 10)
    profile.engine(0.25, 2)
    assert profile.as_dict() == {"steps": 0, "step_s": 0.0, "engine_s": 0.75, "engine_tokens": 12,
                                  "commit_s": 0.0}
