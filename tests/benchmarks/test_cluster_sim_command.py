"""The planning benchmarks of issue 18 run and write what they promise (tiny sizes; no timing
assertions): plan_scaling's old-against-new comparison, and the simulated cluster."""

from __future__ import annotations

import json


def test_plan_scaling_compares_old_and_new_paths(tmp_path) -> None:
    from benchmarks.plan_scaling.__main__ import main

    result = main(["--out", str(tmp_path), "--max-blocks", "1000", "--repeats", "3"])
    saved = json.loads((tmp_path / "plan_scaling.json").read_text())
    assert set(saved["backend"]) == {"streaming", "one_scored", "all_scored", "steady"}
    assert all(c["new_ms"] > 0 and c["legacy_ms"] > 0 for c in saved["backend"].values())
    assert [r["blocks"] for r in saved["incremental"]] == [64, 1_000]
    assert saved["acceptance"]["plan_backend_bound_ms"] == 0.5 == result["acceptance"]["plan_backend_bound_ms"]


def test_cluster_sim_drives_the_real_planner_and_extrapolates(tmp_path) -> None:
    from benchmarks.cluster_sim.__main__ import main

    result = main(["--out", str(tmp_path), "--backends", "6", "--hosts", "2", "--sessions-per-backend", "2",
                   "--seconds", "1", "--view-sizes", "10,50", "--calls", "40", "--old-place-repeats", "2",
                   "--idle-s", "0.2"])
    saved = json.loads((tmp_path / "cluster_sim.json").read_text())
    sim = saved["simulation"]
    assert sim["backends"] == 6 and sim["misplaced_sessions"] == 0 and sim["error_count"] == 0
    assert sim["directory_matches"] and sim["sessions_missing_on_backends"] == 0
    assert sim["reports_per_s"] > 0 and sim["opens_in_churn"] > 0
    target = saved["model"]["target"]
    assert (target["backends"], target["sessions"]) == (1_000, 100_000)
    assert saved["model"]["saturation_backends"]["new"] > 0 and result["model"]["rows"]
    assert (tmp_path / "cluster_sim.png").stat().st_size > 0
