"""A call for a suspended session asks the store port to read its parked blocks ahead (real
llama.cpp, stories260K), so the resume that comes in a later step finds them read; a call for a
live session asks nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvres.actors.config import BackendConfig
from tests.conftest import local_host, shared_model_path

PROMPT = [3 + (7 * i) % 200 for i in range(40)]


def test_a_call_for_a_suspended_session_prefetches_its_parked_blocks(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    config = BackendConfig(name="ahead", model_path=shared_model_path(), n_ctx=512, n_seq_max=1,
                           kv_budget_tokens=400, n_threads=1)
    host = local_host(config, tmp_path / "cold")
    asked: list[list[Any]] = []
    monkeypatch.setattr(host._ctx.store, "prefetch", lambda refs: asked.append(list(refs)))
    host.open_session("a")
    host.append("a", PROMPT)
    host.open_session("b")
    host.append("b", PROMPT[:20])  # one slot: a is parked for it
    assert host.session_stats("a")["state"] == "suspended"
    parked = list(host._ctx.sessions["a"].record.blocks)
    assert asked == []  # b was live for its own calls
    before = host.generate("a", 3)  # a comes back: its blocks were asked for ahead of the resume
    assert asked == [parked]
    assert host.session_stats("a")["counters"]["recomputed_tokens"] == 0 and len(before) == 3
