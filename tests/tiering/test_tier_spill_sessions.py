"""T*'s "f16 + spill" made real: on a backend whose tier decision spills, a session opened with no
eviction policy becomes a spilling streaming session bounded by the resident budget, whose cold
blocks come back when a later turn needs them.

The mapping (``session_policy_for_tier``) on its own, then through ``kvres.cluster`` sessions on a
local Ray cluster whose backends run models/passkey.gguf with the T* choice on and its inputs
pinned by the environment (``runtime_env``: the backend actors read it), so the decision is forced:
c_engage 0 and a target drop of 1 make T* larger than the whole cache, so the top tier is kept
and spills.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvres.actors.config import SessionPolicy
from kvres.actors.sizing.tier_policy import session_policy_for_tier, spill_recent_tokens
from kvres.policy.kv_layout import ModelKVLayout
from kvres.policy.tiering import TierDecision, TieringError, choose_tier, layout_profile_factory
from models import passkey_tasks as pt

GGUF = Path(__file__).resolve().parents[2] / "models" / "passkey.gguf"
N_CTX = 512
RESIDENT = 128  # 25% of the context
FORCE_SPILL = {"KVRES_KV_AUTO_TIER": "1", "KVRES_HOST_RAM_GBPS": "10", "KVRES_VRAM_GBPS": "10",
               "KVRES_C_ENGAGE_MS": "0", "KVRES_KV_TSTAR_DROP": "1"}
PASSKEY_LAYOUT = ModelKVLayout.uniform(global_layers=3, windowed_layers=0, window=0, n_kv_heads=2, head_dim_k=32,
                                       head_dim_v=32)


def _decision(budget_tokens: int, explicit_type_k: str | None = None, target_drop: float = 1.0) -> TierDecision:
    profile_for = layout_profile_factory(PASSKEY_LAYOUT)
    decision = choose_tier(
        profile_for, N_CTX, profile_for("f16", "f16").kv_bytes_for_context(budget_tokens),
        weights_active_bytes=2.5e6, vram_gbps=10.0, host_ram_gbps=10.0, pcie_gbps=None, c_engage_s=0.0,
        target_drop=target_drop, explicit_type_k=explicit_type_k, head_dims=PASSKEY_LAYOUT.head_dims,
    )
    assert decision is not None
    return decision


# -- the mapping -------------------------------------------------------------------------------

def test_a_spilling_tier_turns_no_policy_into_a_bounded_spilling_window() -> None:
    decision = _decision(RESIDENT)
    assert decision.chosen.name == "f16/f16" and decision.spills and decision.position_shift
    for asked in (None, SessionPolicy(), SessionPolicy(kind="none", spill=True)):
        got = session_policy_for_tier(decision, asked, RESIDENT)
        assert got == SessionPolicy(kind="streaming", budget_tokens=RESIDENT, sink_tokens=4,
                                    recent_tokens=spill_recent_tokens(RESIDENT), block_size=8,
                                    observation_window=16, rebase=True, spill=True)
    assert spill_recent_tokens(RESIDENT) == 32 and spill_recent_tokens(4096) == 64


def test_what_the_session_asked_for_is_kept() -> None:
    decision = _decision(RESIDENT)
    own = [SessionPolicy.streaming(96), SessionPolicy.scored(96), SessionPolicy(kind="none", spill=False)]
    for asked in own:
        assert session_policy_for_tier(decision, asked, RESIDENT) is asked
    shaped = session_policy_for_tier(
        decision, SessionPolicy(block_size=4, recent_tokens=8, spill_cap_bytes=1 << 20), RESIDENT)
    assert (shaped.kind, shaped.block_size, shaped.recent_tokens, shaped.spill_cap_bytes) == (
        "streaming", 4, 8, 1 << 20)


def test_no_decision_or_a_resident_tier_changes_nothing() -> None:
    asked = SessionPolicy()
    assert session_policy_for_tier(None, asked, RESIDENT) is asked
    resident = _decision(N_CTX)  # the whole context fits at f16: nothing spills
    assert not resident.spills
    assert session_policy_for_tier(resident, asked, RESIDENT) is asked
    assert session_policy_for_tier(resident, None, RESIDENT) == SessionPolicy()


def test_a_quantized_k_tier_keeps_position_gaps() -> None:
    decision = _decision(RESIDENT, explicit_type_k="q8_0")
    assert decision.chosen.type_k == "q8_0" and decision.spills and not decision.position_shift
    got = session_policy_for_tier(decision, None, RESIDENT)
    assert got.kind == "streaming" and got.rebase is False and got.spill


def test_a_resident_budget_too_small_to_spill_into_is_named() -> None:
    with pytest.raises(TieringError, match=r"resident budget of 14 tokens .* = 15"):
        session_policy_for_tier(_decision(RESIDENT), None, 14)


# -- through the cluster -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    import ray

    from kvres.cluster import BackendConfig, ColdStoreConfig, KvresConfig, connect

    if not GGUF.is_file():
        pytest.fail(f"passkey model missing: {GGUF}", pytrace=False)
    env = {**FORCE_SPILL, "KVRES_CACHE_DIR": str(tmp_path_factory.mktemp("probe-cache"))}
    common = {"model_path": GGUF, "n_ctx": N_CTX, "kv_budget_tokens": RESIDENT, "n_seq_max": 2, "n_threads": 1}
    config = KvresConfig(
        backends=[BackendConfig(name="f16spill", **common),
                  BackendConfig(name="q8spill", type_k="q8_0", **common),
                  BackendConfig(name="resident", **{**common, "kv_budget_tokens": N_CTX})],
        cold_store=ColdStoreConfig(ram_budget_bytes=8 << 20, disk_budget_bytes=16 << 20,
                                   disk_dir=tmp_path_factory.mktemp("tier-spill-coldstore")),
    )
    if ray.is_initialized():
        ray.shutdown()
    mgr = connect(namespace=f"kvres-tier-spill-{uuid.uuid4().hex[:8]}", config=config, num_cpus=2,
                  include_dashboard=False, runtime_env={"env_vars": env})
    yield mgr
    mgr.shutdown()
    ray.shutdown()


def _backend_stats(manager: object, name: str) -> dict:
    import ray

    return dict(ray.get(manager.backend_handle(name).stats.remote()))  # type: ignore[attr-defined]


def _two_turn_passkeys(manager: object, backend: str, tasks: list[pt.PasskeyTask]) -> tuple[int, dict]:
    """Each task as two turns (context, then the question) of a default session on ``backend``:
    how many were answered, and the last session's stats. Every session stayed within its
    resident budget, spilled, and the turns brought blocks back."""
    hits, recalled, st = 0, 0, {}
    for task in tasks:
        q0 = task.question_span[0]
        session = manager.open_session(backend=backend)  # type: ignore[attr-defined]
        try:
            session.append(task.prompt_ids[:q0])
            session.append(task.prompt_ids[q0:])
            hits += session.generate(len(task.answer_ids)) == task.answer_ids
            st = session.stats()
        finally:
            session.close()
        assert st["policy"]["kind"] == "streaming" and st["policy"]["spill"]
        assert st["resident_tokens"] <= st["policy"]["budget_tokens"] < st["token_count"]
        assert st["counters"]["spills"] > 0
        recalled += st["counters"]["recalled_tokens"]
    assert recalled > 0
    return hits, st


def test_a_default_session_spills_and_recalls_the_needle(manager) -> None:
    """Two turns (context, then the question) at a 25%-of-context resident budget: the question's
    turn brings the needle back from the cold store, where the same session without spilling
    (``spill=False``, which keeps kind "none") cannot even hold its context."""
    from kvres.policy import ContextLengthError

    stats = _backend_stats(manager, "f16spill")
    decision = stats["tier_decision"]
    assert decision["chosen"] == "f16/f16" and decision["chosen_spill_bytes"] > 0
    assert stats["kv_budget_tokens"] == RESIDENT
    tasks = pt.fixed_task_set(1, 8, seed=0, n_tokens=(300, 394), depth=(1 / 3, 2 / 3))
    hits, last = _two_turn_passkeys(manager, "f16spill", tasks)
    policy = last["policy"]
    assert (policy["kind"], policy["budget_tokens"], policy["spill"], policy["rebase"]) == (
        "streaming", RESIDENT, True, True)
    assert hits >= len(tasks) - 1, f"{hits}/{len(tasks)} passkeys answered after a spill at 25%"
    kept = manager.open_session(backend="f16spill", policy=SessionPolicy(kind="none", spill=False))
    try:
        assert kept.stats()["policy"]["kind"] == "none"
        with pytest.raises(ContextLengthError, match=f"kv_budget_tokens={RESIDENT}"):
            kept.append(tasks[0].prompt_ids)
    finally:
        kept.close()


def test_a_session_on_a_quantized_k_spill_tier_recalls_the_needle(manager) -> None:
    """The q8_0 K tier keeps position gaps; a turn's scoring pass reads its quantized cells back as
    f16 and brings the needle's blocks back, keeping the token the turn follows (no K-shift)."""
    tasks = pt.fixed_task_set(1, 8, seed=0, n_tokens=(300, 394), depth=(1 / 3, 2 / 3))
    hits, last = _two_turn_passkeys(manager, "q8spill", tasks)
    assert last["policy"]["rebase"] is False
    # without the recall 2 of these 8 were answered
    assert hits >= len(tasks) - 2, f"{hits}/{len(tasks)} passkeys answered on the q8_0 K spill tier"


def test_a_turn_after_a_pause_finds_its_recall_prepared(manager) -> None:
    """Between turns the idle backend reads the session's cold blocks and merges them with its
    resident KV (``recall_prep_us``); the next turn recalls from that and answers."""
    import time

    tasks = pt.fixed_task_set(1, 2, seed=1, n_tokens=(300, 394), depth=(1 / 3, 2 / 3))
    for task in tasks:
        q0 = task.question_span[0]
        session = manager.open_session(backend="f16spill")
        try:
            session.append(task.prompt_ids[:q0])
            deadline = time.monotonic() + 30
            while session.stats()["counters"]["recall_prep_us"] == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert session.stats()["counters"]["recall_prep_us"] > 0
            session.append(task.prompt_ids[q0:])
            assert session.generate(len(task.answer_ids)) == task.answer_ids
            counters = session.stats()["counters"]
            assert counters["recalls"] > 0 and counters["recalled_tokens"] > 0
        finally:
            session.close()


def test_a_default_session_on_a_quantized_k_spill_tier_runs_to_8x_its_budget(manager) -> None:
    """The decision holds K at q8_0 (explicit ``type_k``), so its resident budget buys more tokens
    than the f16 one; the session keeps position gaps (a quantized K cannot shift)."""
    stats = _backend_stats(manager, "q8spill")
    decision, budget = stats["tier_decision"], stats["kv_budget_tokens"]
    assert decision["chosen"].startswith("q8_0/") and decision["position_shift"] is False
    assert budget == decision["resident_budget_tokens"] > RESIDENT
    filler = [t for task in pt.fixed_task_set(1, 5, seed=3, n_tokens=300) for t in task.prompt_ids[1:]]
    session = manager.open_session(backend="q8spill")
    try:
        policy = session.stats()["policy"]
        assert (policy["kind"], policy["budget_tokens"], policy["rebase"]) == ("streaming", budget, False)
        n = 0
        while n < 8 * budget:
            session.append(filler[n : n + 64])
            n += 64 + len(session.generate(8))
            st = session.stats()
            assert st["resident_tokens"] <= budget
        assert st["token_count"] >= 8 * budget and st["counters"]["spills"] > 0
    finally:
        session.close()


def test_a_default_session_migrated_onto_a_spill_tier_spills_there(manager) -> None:
    """Opened where the whole context is resident (kind "none"), moved to a backend whose tier
    spills: it runs there as a session opened there would, bounded by that backend's resident
    budget, and keeps growing past it by spilling. One holding more than that budget is refused
    and stays where it was, whole."""
    from kvres.actors.host.backend import BackendFullError

    decision = _backend_stats(manager, "resident")["tier_decision"]
    assert decision is None or decision["chosen_spill_bytes"] == 0
    task = pt.fixed_task_set(1, 1, seed=4, n_tokens=(300, 394), depth=(1 / 3, 2 / 3))[0]
    session = manager.open_session(backend="resident")
    try:
        assert session.stats()["policy"]["kind"] == "none"
        session.append(task.prompt_ids[:100])
        session.migrate("f16spill")
        policy = session.stats()["policy"]
        assert (policy["kind"], policy["budget_tokens"], policy["spill"]) == ("streaming", RESIDENT, True)
        session.append(task.prompt_ids[100:])
        st = session.stats()
        assert st["backend"] == "f16spill" and st["token_count"] == len(task.prompt_ids)
        assert st["resident_tokens"] <= RESIDENT and st["counters"]["spills"] > 0
        assert len(session.generate(4)) == 4
    finally:
        session.close()
    big = manager.open_session(backend="resident")
    try:
        big.append(task.prompt_ids)
        with pytest.raises(BackendFullError, match="kv_budget_tokens=128"):
            big.migrate("f16spill")  # more resident tokens than that whole backend holds
        st = big.stats()
        assert big.backend == st["backend"] == "resident" and st["token_count"] == len(task.prompt_ids)
    finally:
        big.close()
