"""Degrading a residency policy to what an engine can run (``kvres.policy.degrade``): each unmet gate
gives the weaker behaviour the design names, every other field kept, and the reason said."""

from __future__ import annotations

from dataclasses import fields

import pytest

from kvres.actors.config import SessionPolicy
from kvres.policy import Capabilities
from kvres.policy.degrade import degrade, effective_residency, unmet_gates
from kvres.policy.residency import NoEviction, Residency, Scored, Streaming

FULL = Capabilities(remove_middle=True, position_shift=True, attention_capture=True, key_access=True,
                    kv_export=True)
Q8_K = FULL.without("position_shift", "key_access")  # llama.cpp with a quantized K cache
SWA = FULL.without("position_shift", "key_access", "kv_export")  # llama.cpp, small SWA cache


def _same_shape(a: Residency, b: Residency, *changed: str) -> None:
    for f in fields(Residency):
        if f.init and f.name not in ("name", "degraded", *changed):
            assert getattr(a, f.name) == getattr(b, f.name), f.name


def test_a_capable_engine_runs_the_policy_as_asked() -> None:
    for policy in (SessionPolicy(), SessionPolicy.streaming(128), SessionPolicy.scored(128, "h2o")):
        asked = policy.residency
        assert degrade(asked, FULL) is asked and not asked.degraded
        assert unmet_gates(asked, FULL) == ()


def test_no_position_shift_keeps_gaps() -> None:
    asked = SessionPolicy.streaming(128, recent_tokens=32).residency
    ran = degrade(asked, Q8_K)
    assert isinstance(ran, Streaming) and ran.rebase is False and ran.spill is True
    assert "gaps are kept" in ran.degraded and ran.requirements() == ("remove_middle",)
    _same_shape(asked, ran, "rebase")
    assert "position gaps kept" in ran.describe()


def test_no_score_source_falls_back_to_streaming() -> None:
    asked = SessionPolicy.scored(128, "keynorm", recent_tokens=32, block_size=8).residency
    ran = degrade(asked, Q8_K)
    assert isinstance(ran, Streaming) and not isinstance(ran, Scored)
    assert ran.rebase is False and ran.evicts and not ran.compresses
    assert "keynorm scorer" in ran.degraded and "gaps are kept" in ran.degraded
    _same_shape(asked, ran, "rebase")
    # SnapKV reads attention, which a q8_0 K cache still gives: only the gaps change
    snap = degrade(SessionPolicy.scored(128).residency, Q8_K)
    assert isinstance(snap, Scored) and snap.rebase is False
    no_attention = degrade(SessionPolicy.scored(128, "h2o").residency, FULL.without("attention_capture"))
    assert isinstance(no_attention, Streaming) and "h2o scorer" in no_attention.degraded


def test_no_cold_store_or_no_export_drops_evicted_blocks() -> None:
    asked = SessionPolicy.streaming(128).residency
    no_store = degrade(asked, FULL, cold_store=False)
    assert no_store.spill is False and no_store.rebase and "no cold store" in no_store.degraded
    swa = degrade(asked, SWA)
    assert (swa.spill, swa.rebase) == (False, False) and "cannot export KV" in swa.degraded
    assert [g.capability for g in unmet_gates(asked, SWA)] == ["position_shift", "kv_export"]
    assert degrade(SessionPolicy.streaming(128, spill=False).residency, FULL, cold_store=False).degraded == ""


def test_no_middle_removal_is_no_eviction() -> None:
    ran = degrade(SessionPolicy.scored(128).residency, Capabilities())
    assert isinstance(ran, NoEviction) and not ran.evicts and ran.planned_budget_tokens is None
    assert "nothing is evicted" in ran.degraded


@pytest.mark.parametrize("policy", [SessionPolicy.streaming(128, strict=True), SessionPolicy.scored(128, strict=True)])
def test_strict_policies_are_not_degraded(policy: SessionPolicy) -> None:
    ran = effective_residency(policy.residency, Q8_K, cold_store=False, strict=policy.strict)
    assert ran == policy.residency and not ran.degraded
    assert unmet_gates(ran, Q8_K, cold_store=False)  # the host refuses it at open


def test_the_helpers_take_every_field_of_their_kind() -> None:
    streaming = SessionPolicy.streaming(200, sink_tokens=2, recent_tokens=40, block_size=8, spill=False, rebase=False,
                                        observation_window=12, spill_cap_bytes=1 << 20, strict=True)
    assert streaming == SessionPolicy(kind="streaming", budget_tokens=200, sink_tokens=2, recent_tokens=40,
                                      block_size=8, spill=False, rebase=False, observation_window=12,
                                      spill_cap_bytes=1 << 20, strict=True)
    scored = SessionPolicy.scored(200, "h2o", spill_cap_bytes=4096, strict=True)
    assert (scored.spill_cap_bytes, scored.strict, scored.scorer) == (4096, True, "h2o")
    assert effective_residency(SessionPolicy.engine_evicts(128).residency, Capabilities(), False, addressed=False) \
        == SessionPolicy.engine_evicts(128).residency
