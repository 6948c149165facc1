"""The driver API on a real local Ray cluster with the real llama engine (stories260K)."""

from __future__ import annotations

import contextlib
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
import ray

from kvres.actors.generation import GenerationRequest
from kvres.cluster import BackendConfig, SessionPolicy
from kvres.policy import KvresError, UnknownSessionError

PROMPT = list(range(3, 203))  # 200 token ids, valid in stories260K's 512-token vocabulary


def test_streaming_session_grown_to_8x_budget_stays_under_budget(manager) -> None:
    session = manager.open_session(policy=SessionPolicy.streaming(128, recent_tokens=32), backend="b0")
    session.append(PROMPT[:100])
    assert session.stats()["resident_tokens"] <= 128
    while session.stats()["token_count"] < 8 * 128:
        session.generate(96)
        stats = session.stats()
        assert stats["resident_tokens"] <= 128, stats
    assert stats["counters"]["evictions"] > 0 and stats["counters"]["spills"] > 0
    assert stats["resident_ranges"][0] == (0, 16)
    assert sum(t["blocks"] for t in stats["cold"].values()) == stats["counters"]["spills"]
    session.close()


def test_stream_yields_what_generate_returns(manager) -> None:
    a = manager.open_session(backend="b0")
    b = manager.open_session(backend="b0")
    a.append(PROMPT)
    b.append(PROMPT)
    assert list(a.stream(24)) == b.generate(24)
    a.close()
    b.close()


def _pair(manager, policy: SessionPolicy, backend: str = "b0"):
    ref = manager.open_session(policy=policy, backend=backend)
    sub = manager.open_session(policy=policy, backend=backend)
    for s in (ref, sub):
        s.append(PROMPT)
        s.generate(40)
    return ref, sub


@pytest.mark.parametrize("policy", [SessionPolicy(), SessionPolicy.streaming(160, recent_tokens=32)],
                         ids=["none", "streaming"])
def test_suspend_resume_and_migrate_continue_identically(manager, policy) -> None:
    ref, sub = _pair(manager, policy)
    expected = ref.generate(16) + ref.generate(32)  # same calls: eviction happens per call
    sub.suspend()
    assert sub.stats()["state"] == "suspended" and sub.stats()["resident_tokens"] == 0
    assert sub.resume() == 0
    assert sub.generate(16) == expected[:16]
    sub.migrate("b1")
    assert sub.backend == "b1" and manager.session(sub.session_id).backend == "b1"
    assert sub.generate(32) == expected[16:]
    ref.close()
    sub.close()


def test_idle_session_is_suspended_first_and_comes_back_intact(manager) -> None:
    reference = manager.open_session(backend="b0")
    reference.append(PROMPT[:180])
    expected = reference.generate(20)
    idle = manager.open_session(backend="small")
    idle.append(PROMPT[:180])
    busy = manager.open_session(backend="small", policy=SessionPolicy.streaming(200, recent_tokens=32))
    busy.append(PROMPT[:150])
    assert idle.stats()["state"] == "suspended"
    assert busy.stats()["state"] == "live"
    idle.resume()
    assert idle.stats()["resident_tokens"] == 180
    assert idle.generate(20) == expected
    for s in (reference, idle, busy):
        s.close()


def _scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def _metric(body: str, name: str, session: str) -> float | None:
    for line in body.splitlines():
        if line.startswith(f"ray_{name}{{") and f'session="{session}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_metrics_endpoint_matches_session_stats(manager, metrics_port) -> None:
    from kvres.actors.metrics import session_label

    session = manager.open_session(policy=SessionPolicy.streaming(128, recent_tokens=32), backend="b0")
    session.append(PROMPT)
    session.generate(64)
    stats = session.stats()
    want = {
        "kvres_resident_tokens": stats["resident_tokens"],
        "kvres_evictions_total": stats["counters"]["evictions"],
        "kvres_spills_total": stats["counters"]["spills"],
    }
    deadline = time.time() + 30
    while True:
        body = _scrape(metrics_port)
        got = {name: _metric(body, name, session_label(session.session_id)) for name in want}
        if got == want or time.time() > deadline:
            break
        time.sleep(0.5)
    assert got == want
    assert session.session_id not in body  # labels carry a keyed hash, never the id
    assert re.search(r"^ray_kvres_plan_latency_ms_bucket", body, re.M)
    ram_bytes = sum(
        ray.get(store.stats.remote())["ram_bytes"] for store in manager.cold_stores.values()
    )
    deadline = time.time() + 30
    while True:
        exported = [float(line.rsplit(" ", 1)[1]) for line in _scrape(metrics_port).splitlines()
                    if line.startswith("ray_kvres_cold_bytes{") and 'tier="ram"' in line]
        if sum(exported) == ram_bytes or time.time() > deadline:
            break
        time.sleep(0.5)
    assert exported and sum(exported) == ram_bytes > 0
    session.close()


def test_bad_input_is_typed_and_loses_nothing(manager, tmp_path) -> None:
    with pytest.raises(UnknownSessionError, match="no-such-session"):
        manager.session("no-such-session")
    with pytest.raises(pydantic.ValidationError, match="model_path"):
        BackendConfig(model_path=tmp_path / "missing.gguf")
    with pytest.raises(pydantic.ValidationError, match="n_ctx"):
        BackendConfig(n_ctx=10)
    with pytest.raises(pydantic.ValidationError, match=r"budget_tokens=40 is smaller than sink_tokens"):
        SessionPolicy.streaming(40, recent_tokens=32)
    with pytest.raises(KvresError, match="unknown backend 'nope'"):
        manager.open_session(backend="nope")
    session = manager.open_session(backend="b0")
    session.append(PROMPT[:50])
    with pytest.raises(ValueError, match="token id"):
        session.append([99999])
    with pytest.raises(KvresError, match="unknown backend"):
        session.migrate("nope")
    assert session.stats()["token_count"] == 50
    assert len(session.generate(5)) == 5
    session.close()
    with pytest.raises(UnknownSessionError):
        session.stats()


@pytest.mark.parametrize("backend", ["ov", "ov-recompute"])
def test_openvino_backend_through_the_same_api(manager, backend) -> None:
    """Sessions open on OpenVINO exactly as on llama.cpp: streaming under budget, suspend/resume
    continuing identically."""
    policy = SessionPolicy.streaming(128, recent_tokens=32)
    ref = manager.open_session(policy=policy, backend=backend)
    sub = manager.open_session(policy=policy, backend=backend)
    for s in (ref, sub):
        s.append(PROMPT)
        assert s.stats()["resident_tokens"] <= 128
    expected = ref.generate(24)
    sub.suspend()
    sub.resume()
    assert sub.generate(24) == expected
    stats = sub.stats()
    assert stats["resident_tokens"] <= 128 and stats["counters"]["evictions"] > 0
    assert manager.status()["backends"][[b["backend"] for b in manager.status()["backends"]].index(backend)]["engine"] == "openvino"
    for s in (ref, sub):
        s.close()


def test_migration_across_engines_recomputes_from_the_token_log(manager) -> None:
    """A llama.cpp block cannot be imported into OpenVINO (its fingerprint says so): the session
    still moves, its KV recomputed from the token log, nothing lost."""
    session = manager.open_session(backend="b0")
    session.append(PROMPT)
    session.generate(8)
    before = session.stats()
    session.migrate("ov")
    after = session.stats()
    assert after["backend"] == "ov" and after["token_count"] == before["token_count"]
    assert after["resident_ranges"] == before["resident_ranges"]
    assert after["counters"]["recomputed_tokens"] == before["resident_tokens"]
    assert len(session.generate(8)) == 8
    session.close()


def test_a_handle_follows_its_session_when_another_handle_migrates_it(manager) -> None:
    """Two handles of one session (as two drivers hold them): after one migrates it, the other's
    calls and streams go where the session is now, and its answers are the same tokens."""
    twin = manager.open_session(backend="b0")
    twin.append(PROMPT)
    want = list(twin.generate(12, ignore_eos=True))
    twin.close()
    session = manager.open_session(backend="b0")
    session.append(PROMPT)
    stale, streaming = manager.session(session.session_id), manager.session(session.session_id)
    session.migrate("b1")
    assert list(stale.generate(6, ignore_eos=True)) == want[:6] and stale.backend == "b1"
    assert list(streaming.stream(6, ignore_eos=True)) == want[6:] and streaming.backend == "b1"
    session.migrate("b0")
    assert stale.stats()["backend"] == "b0" and len(stale.tokens()) == len(PROMPT) + 12
    stale.close()
    with pytest.raises(UnknownSessionError):  # closed: nowhere to follow it
        session.tokens()


@pytest.mark.parametrize("scorer", ["snapkv", "h2o"])
def test_scored_session_stays_under_budget_with_sinks_and_recent_kept(manager, scorer) -> None:
    """Scores decide what stays: the scored session keeps other blocks than the same session under
    recency (streaming) would, while sinks, the recent window and the budget hold."""
    policy = SessionPolicy.scored(128, scorer=scorer, recent_tokens=32)
    session = manager.open_session(policy=policy, backend="b0")
    recency = manager.open_session(policy=SessionPolicy.streaming(128, recent_tokens=32), backend="b0")
    for s in (session, recency):
        s.append(PROMPT)
    differs = []
    for _ in range(3):
        for s in (session, recency):
            s.generate(48)
        stats = session.stats()
        assert stats["resident_tokens"] <= 128
        differs.append(stats["resident_ranges"] != recency.stats()["resident_ranges"])
    assert stats["counters"]["evictions"] > 0
    kept = stats["resident_ranges"]
    assert kept[0][0] == 0 and kept[-1][1] == stats["token_count"]  # sinks and recent protected
    assert all(differs), "scored eviction kept what recency keeps: were the scores used?"
    for s in (session, recency):
        s.close()


def test_let_the_engine_evict_on_openvino_genai(manager) -> None:
    """kind='engine': openvino-genai's own CacheEvictionConfig evicts. With no eviction the genai
    backend decodes what llama.cpp decodes; kvres-side policies are refused there, by name."""
    llama = manager.open_session(backend="b0")
    plain = manager.open_session(backend="genai")
    for s in (llama, plain):
        s.append(PROMPT)
    assert plain.generate(16) == llama.generate(16)
    long_prompt = PROMPT + list(range(3, 203))
    evicting = manager.open_session(backend="genai", policy=SessionPolicy.engine_evicts(96, recent_tokens=32))
    uncapped = manager.open_session(backend="genai")
    for s in (evicting, uncapped):
        s.append(long_prompt)
    tokens = evicting.generate(16)
    assert len(tokens) == 16 and evicting.stats()["token_count"] == 400 + 16
    assert tokens != uncapped.generate(16)  # the engine evicted: the continuation saw less KV
    with pytest.raises(ValueError, match="kind 'streaming' is not possible"):
        manager.open_session(backend="genai", policy=SessionPolicy.streaming(128, recent_tokens=32))
    with pytest.raises(ValueError, match="needs an engine that evicts by itself"):
        manager.open_session(backend="b0", policy=SessionPolicy.engine_evicts(96, recent_tokens=32))
    evicting.suspend()
    evicting.resume()
    assert len(evicting.generate(4)) == 4
    for s in (llama, plain, evicting, uncapped):
        s.close()


def test_seeded_sampling_is_reproducible(manager) -> None:
    runs = []
    for _ in range(2):
        s = manager.open_session(backend="b0")
        s.append(PROMPT[:60])
        runs.append(s.generate(24, temperature=0.9, seed=7))
        s.close()
    greedy = manager.open_session(backend="b0")
    greedy.append(PROMPT[:60])
    assert runs[0] == runs[1] != greedy.generate(24)
    with pytest.raises(ValueError, match="temperature"):
        greedy.generate(4, temperature=-1.0)
    greedy.close()


@pytest.mark.parametrize("backend", ["b0", "ov", "ov-recompute"])
def test_a_closed_session_leaves_no_block_in_any_cold_store(manager, backend) -> None:
    session = manager.open_session(policy=SessionPolicy.streaming(128, recent_tokens=32), backend=backend)
    session.append(PROMPT)
    session.suspend()
    stores = list(manager.cold_stores.values())

    def held() -> int:
        return sum(len(ray.get(s.list_session.remote(session.session_id))) for s in stores)

    deadline = time.monotonic() + 20
    while not held() and time.monotonic() < deadline:  # written behind: they land soon after
        time.sleep(0.05)
    assert held() > 0  # spilled and suspended blocks are parked
    session.close()
    assert sum(len(ray.get(s.list_session.remote(session.session_id))) for s in stores) == 0


def test_control_calls_answer_while_a_long_generation_runs(manager) -> None:
    """The backend actor serves stats / suspend / close between engine steps of a running
    generate(4096) (a separate concurrency group), not after it."""
    long = manager.open_session(policy=SessionPolicy.streaming(256, recent_tokens=64), backend="b0")
    other = manager.open_session(backend="b0")
    long.append(PROMPT)
    other.append(PROMPT[:50])
    running = manager.backend_handle("b0").generate.remote(
        long.session_id, GenerationRequest(max_tokens=4096, ignore_eos=True))
    while long.stats()["token_count"] == len(PROMPT):  # wait until it is producing tokens
        pass
    status = manager.status()
    other.suspend()
    during = long.stats()["token_count"]
    still_running = not ray.wait([running], timeout=0)[0]
    other.close()
    assert len(ray.get(running)) == 4096
    assert still_running and during < len(PROMPT) + 4096
    assert any(b["backend"] == "b0" for b in status["backends"])
    long.close()


def test_backends_push_their_load_to_the_planner(manager) -> None:
    """Placement reads the load backends push (rate-limited), not their stats one by one."""
    session = manager.open_session(backend="small")
    session.append(PROMPT[:100])
    deadline = time.time() + 10
    while True:
        view = {b["backend"]: b for b in ray.get(manager.planner.load.remote())["backends"]}
        small = view["small"]
        if small["at"] > 0 and small["resident_tokens"] >= 100 or time.time() > deadline:
            break
        time.sleep(0.05)
    assert small["at"] > 0, "the backend never reported"
    assert small["resident_tokens"] >= 100 and small["live_sessions"] >= 1
    assert small["engine"] == "llama" and small["node"]
    session.close()


@contextlib.contextmanager
def _one_backend_cluster(name: str, tmp_path: Path, n_ctx: int, ram_budget_bytes: int) -> Iterator[Any]:
    """A namespace of its own with one backend ``name`` (KV budget half its context) and a cold store
    of ``ram_budget_bytes`` of RAM, shut down after."""
    import uuid

    from kvres.cluster import ColdStoreConfig, KvresConfig, connect
    from tests.conftest import shared_model_path

    config = KvresConfig(
        backends=[BackendConfig(name=name, model_path=shared_model_path(), n_ctx=n_ctx,
                                kv_budget_tokens=n_ctx // 2, n_threads=1)],
        cold_store=ColdStoreConfig(ram_budget_bytes=ram_budget_bytes, disk_budget_bytes=16 << 20, disk_dir=tmp_path),
    )
    manager = connect(namespace=f"kvres-{name}-{uuid.uuid4().hex[:6]}", config=config)
    try:
        yield manager
    finally:
        manager.shutdown()


def test_eviction_needs_no_planner_actor(manager, tmp_path) -> None:
    """Plans at engine steps are made in the backend's process: with the planner actor dead, a
    streaming session still grows to 8x its budget (2,000 generated tokens) under budget."""
    with _one_backend_cluster("solo", tmp_path, n_ctx=1024, ram_budget_bytes=8 << 20) as solo:
        session = solo.open_session(policy=SessionPolicy.streaming(250, recent_tokens=64))
        session.append(PROMPT[:50])
        ray.kill(solo.planner)
        assert len(session.generate(2000)) == 2000
        stats = session.stats()
        assert stats["token_count"] == 2050 and stats["resident_tokens"] <= 250
        assert stats["peak_resident_tokens"] <= 250 and stats["counters"]["evictions"] > 0


def _stage_limit(actor: object) -> int:
    return int(actor.host._store._stage_limit)  # type: ignore[attr-defined]


def test_a_backends_write_behind_stage_is_a_quarter_of_its_stores_ram(tmp_path) -> None:
    """The backend kvres.cluster starts asks its node's cold store for its RAM budget: with 2 GiB
    there, 512 MiB of recently parked sessions stay in the backend (the least stage is 256 MiB)."""
    with _one_backend_cluster("staged", tmp_path, n_ctx=512, ram_budget_bytes=2 << 30) as staged:
        assert ray.get(staged.backend_handle("staged").__ray_call__.remote(_stage_limit)) == 512 << 20


def _frozen_objects(actor: object) -> int:
    import gc

    return int(gc.get_freeze_count())


def test_backend_and_store_actors_start_with_their_heap_frozen(manager) -> None:
    # what an actor built at start lives as long as it does: a full garbage collection that walks
    # it again (~60 ms in a backend) would stall every session's tokens
    for name in manager.backends():
        assert ray.get(manager.backend_handle(name).__ray_call__.remote(_frozen_objects)) > 10_000, name
    for store in manager.cold_stores.values():
        assert ray.get(store.__ray_call__.remote(_frozen_objects)) > 10_000
