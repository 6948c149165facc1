"""SIGKILL of each kvres actor on a real local cluster: every session continues with its next
call, with the greedy tokens a fault-free run produces."""

from __future__ import annotations

import threading
import time

import pytest
import ray

from kvres.cluster import SessionPolicy

from .conftest import kill, only_store, wait_parked, wait_restarted

PROMPT = [1, *range(100, 400)]


def reference(faulty, backend: str, prompt: list[int], n: int, then: int = 0) -> tuple[list[int], list[int]]:
    """Greedy tokens of an uninterrupted session: ``n`` after the prompt, then ``then`` more."""
    s = faulty.open_session(backend=backend)
    s.append(prompt)
    first = s.generate(n)
    second = s.generate(then) if then else []
    s.close()
    return first, second


@pytest.mark.parametrize("backend", ["f0", "fov"])
def test_backend_killed_between_calls_rebuilds_its_sessions(faulty, backend: str) -> None:
    want_first, want_second = reference(faulty, backend, PROMPT, 16, 16)
    s = faulty.open_session(backend=backend)
    s.append(PROMPT)
    assert s.generate(16) == want_first
    old = kill(faulty.backend_handle(backend))
    assert s.generate(16) == want_second  # no error on the way: the call waits for the restart
    wait_restarted(faulty.backend_handle(backend), old)
    stats = s.stats()
    assert stats["token_count"] == len(PROMPT) + 32
    assert stats["counters"]["rebuilds"] == 1
    assert stats["counters"]["inexact_recomputed_tokens"] == 0
    assert faulty.session(s.session_id).backend == backend
    s.close()


def test_backend_killed_while_suspended_imports_the_parked_blocks(faulty) -> None:
    want_first, want_second = reference(faulty, "f0", PROMPT, 8, 24)
    s = faulty.open_session(backend="f0")
    s.append(PROMPT)
    assert s.generate(8) == want_first
    s.suspend()
    wait_parked(only_store(faulty), s.session_id)  # handed over write-behind: in the store before the kill
    kill(faulty.backend_handle("f0"))
    assert s.resume() == 0  # every parked block imported: nothing recomputed
    assert s.generate(24) == want_second
    assert s.stats()["counters"]["rebuilds"] == 1
    s.close()


def test_a_migration_whose_detach_answer_was_lost_still_arrives(faulty) -> None:
    """The source backend commits the detach (the session on its way, served by nobody) and dies
    before the answer reaches the driver: the migration finds the record in the journal and
    finishes; nothing is lost or left without a backend."""
    s = faulty.open_session(backend="f0")
    s.append(PROMPT)
    first = s.generate(8)
    before = s.stats()
    source = faulty.backend_handle("f0")
    ray.get(source.detach.remote(s.session_id))  # what migrate's detach does, its answer then lost:
    old = kill(source)
    s.migrate("fov")
    after = s.stats()
    assert after["backend"] == "fov" and s.backend == "fov"
    assert after["token_count"] == before["token_count"] == len(PROMPT) + len(first)
    assert ray.get(faulty.planner.where.remote(s.session_id)) == "fov"
    assert len(s.generate(8)) == 8
    wait_restarted(source, old)
    s.close()


def test_backend_killed_mid_generate_finishes_the_call_once(faulty) -> None:
    want, _ = reference(faulty, "f0", PROMPT, 512)
    s = faulty.open_session(backend="f0")
    s.append(PROMPT)
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["tokens"] = s.generate(512)
        except Exception as exc:  # pragma: no cover - shown by the assertion below
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.5)
    kill(faulty.backend_handle("f0"))
    t.join(timeout=300)
    assert "error" not in out, out.get("error")
    assert out["tokens"] == want
    assert s.stats()["token_count"] == len(PROMPT) + 512  # committed once, not twice
    s.close()


def test_stream_survives_a_backend_death_without_repeating_tokens(faulty) -> None:
    want, _ = reference(faulty, "f0", PROMPT, 200)
    s = faulty.open_session(backend="f0")
    s.append(PROMPT)
    got: list[int] = []
    for i, token in enumerate(s.stream(200)):
        got.append(token)
        if i == 20:
            kill(faulty.backend_handle("f0"))
    assert got == want
    assert s.stats()["token_count"] == len(PROMPT) + 200
    s.close()


def test_cold_store_killed_while_suspended(faulty) -> None:
    want_first, want_second = reference(faulty, "f0", PROMPT, 8, 24)
    sessions = []
    for _ in range(3):
        s = faulty.open_session(backend="f0")
        s.append(PROMPT)
        assert s.generate(8) == want_first
        s.suspend()
        sessions.append(s)
    store = only_store(faulty)
    for s in sessions:
        wait_parked(store, s.session_id)  # handed over write-behind: in the store before the kill
    kill(store)
    for s in sessions:
        s.resume()  # blocks on the store's disk tier are imported, the rest recomputed
        assert s.generate(24) == want_second
        assert s.stats()["state"] == "live"
        s.close()


def test_planner_killed_keeps_the_directory_and_places_again(faulty) -> None:
    s = faulty.open_session(policy=SessionPolicy())
    s.append(PROMPT[:50])
    old = kill(faulty.planner)
    assert faulty.session(s.session_id).backend == s.backend  # the directory came back
    other = faulty.open_session()
    other.append(PROMPT[:20])
    wait_restarted(faulty.planner, old)
    assert set(faulty.status(detail=False)["sessions"]) >= {s.session_id, other.session_id}
    s.close()
    other.close()
    assert s.session_id not in faulty.status(detail=False)["sessions"]
