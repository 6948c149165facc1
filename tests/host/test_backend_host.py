"""BackendHost without Ray: budgets, suspend/resume, spill to a real cold store, lost blocks.

The engine here is the reference executor (the project's pure-Python executor that the
conformance table holds every engine to); the Ray tests run the same host on llama.cpp.
"""

from __future__ import annotations

import pytest

from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.actors.host.backend import BackendFullError, BackendHost
from kvres.actors.ray_actors.coldstore_actor import ColdStoreServer
from kvres.policy import ContextLengthError, UnknownSessionError
from kvres.policy.backend_planner import plan_backend
from kvres.testing import LocalStorePort, ReferenceExecutor


def tokens(n: int, seed: int = 0) -> list[int]:
    return [3 + (i * 5 + seed) % 50 for i in range(n)]


@pytest.fixture()
def stores(tmp_path):
    return {"node-a": ColdStoreServer(1 << 20, tmp_path / "a", 1 << 24),
            "node-b": ColdStoreServer(1 << 20, tmp_path / "b", 1 << 24)}


def host(stores, name="node-a", budget=512, n_seq_max=4, room_wait_s=60.0) -> BackendHost:
    config = BackendConfig(name=f"b-{name}", kv_budget_tokens=budget, n_ctx=1024, n_seq_max=n_seq_max,
                           max_room_wait_s=room_wait_s)
    return BackendHost(config, ReferenceExecutor(), plan_backend, LocalStorePort(name, stores))


def test_streaming_session_stays_under_budget(stores) -> None:
    h = host(stores)
    h.open_session("s", SessionPolicy.streaming(128, sink_tokens=4, recent_tokens=32))
    for _ in range(8):
        h.append("s", tokens(64))
        assert h.session_stats("s")["resident_tokens"] <= 128
    generated = h.generate("s", 200)
    assert len(generated) == 200
    stats = h.session_stats("s")
    assert stats["resident_tokens"] <= 128 and stats["token_count"] == 8 * 64 + 200
    assert stats["counters"]["evictions"] > 0 and stats["counters"]["spills"] == stats["counters"]["evictions"]
    assert stats["resident_ranges"][0] == (0, 16)  # sinks stay
    # every new append recalls the cold blocks, and what the compression does not keep is spilled again
    counters = stats["counters"]
    assert counters["recalls"] > 0 and counters["recalled_tokens"] > 0
    assert sum(v["blocks"] for v in stats["cold"].values()) == counters["spills"] - counters["recalls"]


def test_suspend_resume_gives_the_same_continuation(stores) -> None:
    a, b = host(stores), host(stores)
    for h in (a, b):
        h.open_session("s", SessionPolicy.streaming(128, recent_tokens=32))
        h.append("s", tokens(300))
    expected = a.generate("s", 40)
    b.suspend("s")
    assert b.session_stats("s")["state"] == "suspended"
    assert b.resume("s") == 0
    assert b.generate("s", 40) == expected
    c = host(stores)
    c.open_session("s", SessionPolicy.streaming(128, recent_tokens=32))
    c.append("s", tokens(300))
    c.suspend("s")
    assert c.generate("s", 40) == expected  # the next call brings a suspended session back itself
    assert c.session_stats("s")["counters"]["resumes"] == 1


def test_migrate_between_hosts_and_lost_block_is_recomputed(stores) -> None:
    a, b, ref = host(stores, "node-a"), host(stores, "node-b"), host(stores)
    for h in (a, ref):
        h.open_session("s", SessionPolicy())
        h.append("s", tokens(100))
    expected = ref.generate("s", 20)
    record = a.detach("s")
    stores["node-a"].delete(record.blocks[0].key)  # the block is lost on the way
    recomputed = b.resume("s", record)
    assert recomputed == 100
    assert b.generate("s", 20) == expected
    with pytest.raises(UnknownSessionError):
        a.session_stats("s")


def test_idle_session_is_suspended_first_and_comes_back(stores) -> None:
    h = host(stores, budget=256)
    h.open_session("idle", SessionPolicy())
    h.append("idle", tokens(150))
    h.open_session("busy", SessionPolicy.streaming(200, recent_tokens=32))
    h.append("busy", tokens(190))
    assert h.session_stats("idle")["state"] == "suspended"
    assert h.session_stats("busy")["resident_tokens"] <= 200
    h.resume("idle")  # makes room by suspending the other, least recently used
    assert h.session_stats("idle")["resident_tokens"] == 150
    assert h.session_stats("busy")["state"] == "suspended"


def test_past_its_context_limit_is_typed_and_loses_nothing(stores) -> None:
    h = host(stores, budget=64)
    h.open_session("s", SessionPolicy())
    h.append("s", tokens(60))
    with pytest.raises(ContextLengthError, match=r"70 is past the 64 tokens .*kv_budget_tokens=64"):
        h.append("s", tokens(10))
    assert h.session_stats("s")["token_count"] == 60
    reply = h.generate("s", 10)
    assert reply.finish_reason == "length" and len(reply) == 4  # stopped at the limit, as at max_tokens


def test_room_others_hold_is_a_typed_refusal_that_frees(stores) -> None:
    h = host(stores, budget=64, room_wait_s=0.2)  # it waits for room that long, then is refused
    h.open_session("pinned", SessionPolicy().with_retention(pin=True))
    h.append("pinned", tokens(30))
    h.open_session("s", SessionPolicy())
    h.append("s", tokens(30))
    with pytest.raises(BackendFullError, match="kv_budget_tokens=64"):
        h.append("s", tokens(10))  # within what s may hold, but the pinned session keeps its room
    assert h.session_stats("s")["token_count"] == 30
    h.close("pinned")
    h.append("s", tokens(10))
    assert h.session_stats("s")["token_count"] == 40


def test_bad_input(stores) -> None:
    h = host(stores)
    with pytest.raises(UnknownSessionError, match="nope"):
        h.append("nope", [1])
    with pytest.raises(ValueError, match="exceeds backend"):
        h.open_session("s", SessionPolicy.streaming(1024))
    h.open_session("s", SessionPolicy())
    with pytest.raises(ValueError, match="max_tokens"):
        h.generate("s", -1)


@pytest.mark.parametrize(("bandwidth_gbps", "recomputed"), [(100.0, 0), (1e-6, 300)],
                         ids=["fast-tier-recalls", "slow-tier-recomputes"])
def test_resume_chooses_recall_or_recompute_from_costs(stores, bandwidth_gbps, recomputed) -> None:
    from kvres.policy.recall import PrefillCost, RecallCosts, TierCost

    costs = RecallCosts({"ram": TierCost("ram", bandwidth_gbps, 1e-6),
                         "disk": TierCost("disk", bandwidth_gbps, 1e-4)},
                        PrefillCost(tokens_per_s=10_000.0, fixed_s=1e-4))
    config = BackendConfig(name="b", kv_budget_tokens=512, n_ctx=1024)
    port = LocalStorePort("node-a", stores)
    h = BackendHost(config, ReferenceExecutor(), plan_backend, port, recall_costs=lambda: costs)
    ref = host(stores)
    for x in (h, ref):
        x.open_session("s", SessionPolicy())
        x.append("s", tokens(300))
    expected = ref.generate("s", 10)
    h.suspend("s")
    assert h.resume("s") == recomputed
    assert h.generate("s", 10) == expected


@pytest.mark.parametrize("rebase", [True, False])
def test_session_policy_chooses_rebase_or_gaps(stores, rebase) -> None:
    h = host(stores)
    policy = SessionPolicy(kind="streaming", budget_tokens=128, recent_tokens=32, rebase=rebase)
    h.open_session("s", policy)
    h.append("s", tokens(300))
    positions = h.executor.cache_positions("s")
    kept = positions[positions >= 0]
    assert (kept.max() == len(kept) - 1) == rebase  # compact positions only when re-based


def test_drop_policy_evicts_without_spilling(stores) -> None:
    h = host(stores)
    h.open_session("s", SessionPolicy.streaming(128, recent_tokens=32, spill=False))
    h.append("s", tokens(400))
    stats = h.session_stats("s")
    assert stats["counters"]["evictions"] > 0 and stats["counters"]["spills"] == 0
    assert stats["cold"] == {} and stats["resident_tokens"] <= 128
    assert stats["token_count"] == 400  # dropped KV, kept tokens: the log still has everything


def test_spilled_bytes_stay_under_the_sessions_cap(stores) -> None:
    """The oldest spills go first; the store holds no more than the cap for the session, and its
    stats count only what is still there."""
    h = host(stores)
    capped = SessionPolicy.streaming(128, recent_tokens=32).model_copy(update={"spill_cap_bytes": 200})
    h.open_session("s", capped)
    h.append("s", tokens(400))
    h.generate("s", 200)
    stats = h.session_stats("s")
    held = sum(v["bytes"] for v in stats["cold"].values())
    assert 0 < held <= 200 and stats["counters"]["spill_dropped"] > 0
    assert sum(len(st.list_session("s")) for st in stores.values()) == sum(v["blocks"] for v in stats["cold"].values())
    h.close("s")
