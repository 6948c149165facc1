"""A backend host runs its sessions as its KV tier decision says (T*'s "f16 + spill"): given a
decision that spills, ``BackendHost`` opens a session asked for with no eviction policy as a
spilling streaming session bounded by the resident budget, and runs a session handed over from
another backend the same way; what a session asked for itself, and a host without a decision,
change nothing. (The mapping alone, and through the cluster: tests/tiering/test_tier_spill_sessions.py.)
"""

from __future__ import annotations

import pytest

from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.actors.host.backend import BackendHost
from kvres.actors.ray_actors.coldstore_actor import ColdStoreServer
from kvres.actors.sizing.tier_policy import session_policy_for_tier
from kvres.policy.kv_layout import ModelKVLayout
from kvres.policy.tiering import TierDecision, choose_tier, layout_profile_factory
from kvres.testing import LocalStorePort, ReferenceExecutor

N_CTX = 512
RESIDENT = 128  # the resident budget the decision leaves: a quarter of the context
LAYOUT = ModelKVLayout.uniform(global_layers=3, windowed_layers=0, window=0, n_kv_heads=2, head_dim_k=32,
                               head_dim_v=32)


def spilling_decision() -> TierDecision:
    """c_engage 0 and a target drop of 1 make T* larger than the whole cache: the top tier is kept
    and what does not fit ``RESIDENT`` tokens spills."""
    profile_for = layout_profile_factory(LAYOUT)
    decision = choose_tier(
        profile_for, N_CTX, profile_for("f16", "f16").kv_bytes_for_context(RESIDENT),
        weights_active_bytes=2.5e6, vram_gbps=10.0, host_ram_gbps=10.0, pcie_gbps=None, c_engage_s=0.0,
        target_drop=1.0, explicit_type_k=None, head_dims=LAYOUT.head_dims,
    )
    assert decision is not None and decision.spills
    return decision


@pytest.fixture()
def stores(tmp_path):
    return {"n": ColdStoreServer(1 << 22, tmp_path / "n", 1 << 24)}


def host(stores, name: str, decision: TierDecision | None) -> BackendHost:
    config = BackendConfig(name=name, kv_budget_tokens=RESIDENT, n_ctx=N_CTX, n_seq_max=4)
    return BackendHost(config, ReferenceExecutor(), store=LocalStorePort("n", stores), tier_decision=decision)


def tokens(n: int) -> list[int]:
    return [3 + (i * 5) % 50 for i in range(n)]


def test_a_session_with_no_eviction_policy_opens_as_a_spilling_window(stores) -> None:
    decision = spilling_decision()
    h = host(stores, "spills", decision)
    h.open_session("s")
    runs = session_policy_for_tier(decision, None, RESIDENT)
    assert runs.kind == "streaming" and runs.budget_tokens == RESIDENT and runs.spill
    assert h.session_stats("s")["policy"] == runs.model_dump()
    h.append("s", tokens(300))
    stats = h.session_stats("s")
    assert stats["resident_tokens"] <= RESIDENT and stats["counters"]["spills"] > 0
    own = SessionPolicy.streaming(96, recent_tokens=16)
    h.open_session("own", own)
    assert h.session_stats("own")["policy"] == own.model_dump()  # what it asked for itself is kept
    h.shutdown()


def test_a_session_handed_over_runs_as_it_would_have_opened_here(stores) -> None:
    decision = spilling_decision()
    plain, spilling = host(stores, "plain", None), host(stores, "spills", decision)
    plain.open_session("m")
    assert plain.session_stats("m")["policy"] == SessionPolicy().model_dump()  # no decision: as asked
    plain.append("m", tokens(64))
    record = plain.detach("m")
    assert record.policy == SessionPolicy()
    assert spilling.resume("m", record) == 0
    stats = spilling.session_stats("m")
    assert stats["policy"] == session_policy_for_tier(decision, record.policy, RESIDENT).model_dump()
    assert stats["policy"]["kind"] == "streaming" and stats["token_count"] == 64
    for h in (plain, spilling):
        h.shutdown()
