"""Placement from pushed load: the reports, their rate limit, the choice and the planner's view."""

from __future__ import annotations

import pytest

from kvres.policy import KvresError
from kvres.policy.placement import (
    BackendLoad,
    LoadReport,
    LoadReportError,
    LoadView,
    PlacementError,
    PlacementPolicy,
    ReportLimiter,
    choose_backend,
    serves,
)
from kvres.policy.residency import EngineNeed

MODEL = "/models/stories260K.gguf"


def report(name: str, resident: int = 0, budget: int = 1000, live: int = 0, **kw) -> LoadReport:
    return LoadReport(name, budget, resident, live_sessions=live, n_seq_max=kw.pop("n_seq_max", 8),
                      model=kw.pop("model", MODEL), **kw)


def loads(*reports: LoadReport) -> list[BackendLoad]:
    return [BackendLoad(r) for r in reports]


def test_load_report_validation_names_the_field() -> None:
    assert report("a", resident=300).free_tokens == 700
    with pytest.raises(LoadReportError, match=r"resident_tokens must be an int >= 0, got -1 \(a\)"):
        report("a", resident=-1)
    with pytest.raises(LoadReportError, match="n_seq_max must be >= 1, got 0"):
        report("a", n_seq_max=0)
    with pytest.raises(ValueError, match="non-empty"):
        LoadReport("", 10)
    assert issubclass(LoadReportError, KvresError) and issubclass(PlacementError, ValueError)


def test_limiter_pushes_changes_at_most_every_interval_and_heartbeats() -> None:
    limiter = ReportLimiter(min_interval_s=0.1, change_fraction=0.05, heartbeat_s=2.0)
    assert limiter.offer(report("a", 100), now=10.0)  # the first report always goes
    assert not limiter.offer(report("a", 900, live=1), now=10.05)  # too soon, even for a change
    assert limiter.held(now=10.06) is None
    assert limiter.held_due() == pytest.approx(10.1)  # when the held change may go
    held = limiter.held(now=10.2)  # the change held back goes once the interval has passed
    assert held is not None and held.live_sessions == 1
    assert limiter.held_due() is None
    assert not limiter.offer(report("a", 940, live=1), now=10.4)  # 40 tokens: under 5% of 1000
    assert limiter.offer(report("a", 960, live=1), now=10.5)  # 60 tokens since the last push
    assert not limiter.offer(report("a", 960, live=1), now=11.0)
    assert limiter.offer(report("a", 961, live=1), now=12.6)  # heartbeat
    assert limiter.offer(report("a", 961, live=2), now=12.8)  # a session opened
    with pytest.raises(LoadReportError, match="min_interval_s must be >= 0, got -1"):
        ReportLimiter(min_interval_s=-1)


def test_sessions_of_a_model_go_only_to_backends_of_that_model() -> None:
    pool = loads(report("big", model="/m/other.gguf"), report("mine", 500),
                 LoadReport("id", 1000, model="/x/renamed.gguf", model_id="abc123", n_seq_max=8))
    assert choose_backend(pool, MODEL) == "mine"
    assert choose_backend(pool, "stories260K.gguf") == "mine"
    assert choose_backend(pool, "/models/./stories260K.gguf") == "mine"
    assert choose_backend(pool, "abc123") == "id"
    assert choose_backend(pool, None) in ("big", "id")
    with pytest.raises(PlacementError, match=r"no backend serves model 'nope.gguf'; backends serve \["):
        choose_backend(pool, "nope.gguf")
    assert serves(pool[0].report, "other.gguf") and not serves(pool[0].report, "other")


def test_engine_kinds_and_session_size_narrow_the_choice() -> None:
    pool = loads(report("llama", 0), report("genai", 0, engine="openvino-genai", engine_evicts=True),
                 report("tiny", 0, budget=100))
    assert choose_backend(pool, MODEL, need=EngineNeed.ENGINE_MANAGED) == "genai"
    assert choose_backend(pool, MODEL, need=EngineNeed.KVRES_ADDRESSED) == "llama"
    assert choose_backend(pool, MODEL, need=EngineNeed.KVRES_ADDRESSED, demand_tokens=1000) == "llama"
    with pytest.raises(PlacementError, match="budget_tokens=2000 fits no backend.*largest kv_budget_tokens .* 1000"):
        choose_backend(pool, MODEL, need=EngineNeed.KVRES_ADDRESSED, demand_tokens=2000)
    with pytest.raises(PlacementError, match="runs a session that needs an engine-managed engine"):
        choose_backend(loads(report("llama")), MODEL, need=EngineNeed.ENGINE_MANAGED)


def test_least_loaded_prefers_a_free_slot_then_free_tokens_then_fewer_sessions() -> None:
    pool = loads(report("a", 600), report("b", 200, live=3), report("c", 200, live=1))
    assert choose_backend(pool, MODEL) == "c"
    full = loads(report("a", 0, live=2, n_seq_max=2), report("b", 900, live=1))
    assert choose_backend(full, MODEL) == "b"  # "a" would have to suspend a session first


def test_pack_fills_the_fullest_backend_that_still_fits() -> None:
    pool = loads(report("a", 100), report("b", 700), report("c", 950))
    pack = PlacementPolicy("pack")
    assert choose_backend(pool, MODEL, pack, "streaming", 200) == "b"
    assert choose_backend(pool, MODEL, pack, "streaming", 50) == "c"
    assert choose_backend(pool, MODEL, pack, "streaming", 950) == "a"  # falls back to least loaded


def test_node_labels() -> None:
    pool = loads(report("a", 900, labels={"zone": "a"}), report("b", 0, labels={"zone": "b"}),
                 report("a2", 100, labels={"zone": "a", "gpu": "h200"}))
    assert choose_backend(pool, MODEL, PlacementPolicy("label", {"zone": "a"})) == "a2"
    assert choose_backend(pool, MODEL, PlacementPolicy("pack", {"zone": "a"}), "streaming", 50) == "a"
    with pytest.raises(PlacementError, match=r"labelled \{'zone': 'c'\}; their nodes' labels: \{'a'"):
        choose_backend(pool, MODEL, PlacementPolicy("label", {"zone": "c"}))
    with pytest.raises(PlacementError, match="needs labels"):
        PlacementPolicy("label")
    with pytest.raises(PlacementError, match="one of .* got 'random'"):
        PlacementPolicy.of("random")
    assert PlacementPolicy.of(None, PlacementPolicy("pack")).kind == "pack"


def test_a_burst_of_placements_spreads_before_any_backend_reports() -> None:
    view = LoadView()
    view.seed([report(n) for n in ("a", "b", "c")])
    placed = [view.place(f"s{i}", now=1.0, model=MODEL, need=EngineNeed.KVRES_ADDRESSED, demand_tokens=100)
              for i in range(6)]
    assert placed == ["a", "b", "c", "a", "b", "c"]
    assert {b.name: (b.pending_sessions, b.free_tokens) for b in view.loads()} == {
        "a": (2, 800), "b": (2, 800), "c": (2, 800)}
    packed = [view.place(f"p{i}", now=1.0, placement=PlacementPolicy("pack"), demand_tokens=100) for i in range(2)]
    assert packed == ["a", "a"]


def test_a_report_replaces_the_placements_it_measured() -> None:
    view = LoadView()
    view.seed([report("a"), report("b")])
    assert view.place("s1", now=5.0) == "a"
    assert view.place("s2", now=7.0) == "b"
    view.report(report("a", 300, live=1, at=6.0))  # measured after s1 was placed: s1 is in it
    view.report(report("b", 0, at=6.0))  # measured before s2 arrived: s2 still pending
    got = {b.name: (b.report.live_sessions, b.pending_sessions, b.free_tokens) for b in view.loads()}
    assert got == {"a": (1, 0, 700), "b": (0, 1, 1000)}
    view.report(report("a", 900, live=1, at=5.5))  # older than the one kept: ignored
    view.seed([report("a")])  # a measured backend keeps its report
    assert view.loads()[0].report.resident_tokens == 300
    view.forget_session("s2")  # closed, or its opening failed
    assert [b.pending_sessions for b in view.loads()] == [0, 0]
    assert view.totals() == {"backends": 2, "unreported": 0, "budget_tokens": 2000, "resident_tokens": 300,
                             "free_tokens": 1700, "live_sessions": 1, "suspended_sessions": 0,
                             "pending_sessions": 0}
    view.forget_backend("a")
    assert [b.name for b in view.loads()] == ["b"]
