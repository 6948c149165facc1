"""What the fleet workload relies on in the host (real llama.cpp, no Ray): a suspend made for
room is counted once (a caller's is not) and its count survives the resume, and the session suspended for a slot is the
one needed last (a finished turn's), not one whose reply is still to come."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvres.actors.backend_setup.engine_registry import make_executor
from kvres.actors.config import BackendConfig
from kvres.actors.host import stepper
from kvres.actors.host.backend import BackendHost
from kvres.actors.ray_actors.coldstore_actor import ColdStoreServer
from kvres.testing import LocalStorePort
from tests.conftest import shared_model_path


def _host(tmp_path: Path) -> BackendHost:
    model = shared_model_path()
    config = BackendConfig(name="fleet", model_path=model, n_ctx=512, n_seq_max=2, kv_budget_tokens=512, n_threads=1)
    store = ColdStoreServer(16 << 20, tmp_path / "cold", 64 << 20)
    return BackendHost(config, make_executor(config, model), store=LocalStorePort("n", {"n": store}))


def _counter(host: BackendHost, sid: str, name: str) -> int:
    return int(host.session_stats(sid)["counters"][name])


def test_each_suspend_is_counted_once_and_survives_its_resume(tmp_path: Path) -> None:
    host = _host(tmp_path)
    for sid in ("a", "b", "c"):  # the third takes a slot: one of the first two is suspended for it
        host.open_session(sid)
        host.append(sid, list(range(10, 40)))
    states = {sid: host.session_stats(sid)["state"] for sid in ("a", "b", "c")}
    parked = [sid for sid, state in states.items() if state == "suspended"]
    assert len(parked) == 1 and _counter(host, parked[0], "suspends") == 1
    host.append(parked[0], [5, 6])  # resumed for its call (another one goes)
    assert _counter(host, parked[0], "suspends") == 1 and _counter(host, parked[0], "resumes") == 1
    total = sum(_counter(host, sid, "suspends") for sid in ("a", "b", "c"))
    assert total == 2 == sum(_counter(host, sid, "resumes") for sid in ("a", "b", "c")) + 1
    live = next(sid for sid in ("a", "b", "c") if host.session_stats(sid)["state"] == "live")
    before = _counter(host, live, "suspends")
    host.suspend(live)  # a caller's suspend is not one made for room (the actor counts it in explicit_suspends)
    assert _counter(host, live, "suspends") == before and host.session_stats(live)["state"] == "suspended"


def test_the_slot_goes_to_the_session_needed_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stepper, "MID_TURN_GRACE_S", 3600.0)  # no clock in the test: the reply is always awaited
    host = _host(tmp_path)
    host.open_session("a")
    host.append("a", list(range(10, 30)))  # a's user turn is in; its reply is yet to be asked for
    host.open_session("b")
    host.append("b", list(range(10, 30)))
    host.generate("b", 3)  # b's turn is done (and b was used after a)
    host.open_session("c")  # a slot for c: least recently used would take a
    assert host.session_stats("a")["state"] == "live"
    assert host.session_stats("b")["state"] == "suspended"
    host.generate("a", 3)  # a's turn ends: now a is the one to go
    host.append("b", [7])
    assert host.session_stats("a")["state"] == "suspended" or host.session_stats("c")["state"] == "suspended"


def test_a_shared_system_prompt_is_taken_from_a_live_session_not_prefilled(tmp_path: Path) -> None:
    host = _host(tmp_path)
    decoded: list[int] = []
    append_many_first = host.executor.append_many_first

    def counting(first, rest, between):  # type: ignore[no-untyped-def]
        decoded.append(sum(len(t) for _, t in [*first, *rest]))
        return append_many_first(first, rest, between)

    host.executor.append_many_first = counting  # type: ignore[method-assign]
    prompt = [int(t) for t in range(20, 80)]  # 60 tokens, the shared system prompt
    host.open_session("a")
    host.append("a", prompt + [5, 6, 7])
    host.open_session("b")
    decoded.clear()
    host.append("b", prompt + [9, 10, 11, 12])
    assert sum(decoded) == 4  # only b's own tokens were decoded
    assert host.tokens("b") == prompt + [9, 10, 11, 12] and host.session_stats("b")["resident_tokens"] == 64
    host.close("a")  # b keeps the cells it shares
    shared = host.generate("b", 6)

    alone = _host(tmp_path / "alone")
    alone.open_session("b")
    alone.append("b", prompt + [9, 10, 11, 12])
    assert list(alone.generate("b", 6)) == list(shared)  # the same continuation as a prefill gives
