"""``python -m benchmarks.fleet --tiny`` runs every system on the same turns and writes what it
promises (a tiny model; no timing assertions): every turn of every run completed, the counters and
ratios the issue asks for are there and consistent with the rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.fleet.workload import TurnTiming, Workload, summarize

ROWS = ("slot_baseline", "reprefill_baseline", "llama_batch", "llama_batch_2_at_once", "kvres_2_slots", "kvres_4_slots", "kvres_shared_prefix",
        "kvres_mixed_high", "kvres_mixed_low")


def test_fleet_tiny_writes_json_and_png(tmp_path: Path) -> None:
    from benchmarks.fleet.__main__ import main

    result = main(["--tiny", "--open-repeats", "2", "--repeats", "2", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "fleet.json").read_text())
    assert saved["ratios"] == result["ratios"] and saved["slots"] == [2, 4]
    w = saved["workload"]
    assert set(saved["rows"]) == set(ROWS) and saved["repeats"] == 2
    assert len(saved["rows"]["kvres_2_slots"]["runs_turns_per_s"]) == 2 == len(saved["rows"]["llama_batch"]["runs_turns_per_s"])
    mixed = {"kvres_mixed_high": w["turns"], "kvres_mixed_low": (w["sessions"] - 1) * w["turns"]}  # --high 1
    for name, row in saved["rows"].items():
        expected = 2 * w["turns"] if name == "reprefill_baseline" else mixed.get(name, w["sessions"] * w["turns"])
        assert row["turns"] == expected, name
        assert row["turns_per_s"] > 0 and 0 < row["ttft_p50_ms"] <= row["latency_p50_ms"] <= row["latency_p99_ms"]
    for name in ("kvres_2_slots", "kvres_4_slots", "kvres_shared_prefix", "kvres_mixed_high", "kvres_mixed_low"):
        row = saved["rows"][name]
        assert row["failed_turns"] == 0, row["failures"]
        for counter in ("suspends", "resumes", "evictions", "recomputed_tokens"):
            assert row[f"{counter}_per_turn"] >= 0
        assert 0 < row["peak_resident_tokens"] <= row["kv_budget_tokens"]
    # 4 sessions over 2 slots must park some; over 4 slots none has to
    assert saved["rows"]["kvres_2_slots"]["resumes_per_turn"] > 0
    assert saved["rows"]["kvres_2_slots"]["parked_kv_bytes"]
    assert saved["rows"]["reprefill_baseline"]["recomputed_tokens_per_turn"] >= w["history"]
    ratios = saved["ratios"]
    paired = [k / b for k, b in zip(saved["rows"]["kvres_2_slots"]["runs_turns_per_s"],
                                    saved["rows"]["slot_baseline"]["runs_turns_per_s"], strict=True)]
    assert ratios["kvres_2_slots_over_slot_baseline"] == pytest.approx(sum(paired) / 2)  # the median of two
    assert set(ratios["acceptance"]) >= {"few_slots_ge_1.5x_slot_baseline", "all_slots_ge_0.8x_llama_batch",
                                         "mixed_high_p99_le_1.5x_p50", "mixed_low_all_complete"}
    assert ratios["acceptance"]["mixed_low_all_complete"]
    # the engine's own bound for 2 slots: llama.cpp batching at most 2 of the 3 users' turns at once
    assert saved["rows"]["llama_batch_2_at_once"]["max_active"] == 2 and saved["rows"]["llama_batch"]["max_active"] == 3
    assert set(ratios["engine_bounds"]) == {"llama_batch_2_at_once_over_slot_baseline",
                                            "llama_batch_2_at_once_over_reprefill", "llama_batch_over_slot_baseline"}
    assert ratios["kvres_2_slots_over_llama_batch_2_at_once"] > 0
    assert saved["shared_prefix_open"]["shared_open_s"] > 0 and saved["shared_prefix"] == 16
    assert (tmp_path / "fleet.png").stat().st_size > 0
    first = saved["first_turns"]
    assert len(first["turn_s"]) == 4 and first["ratio"] == pytest.approx(first["first_turn_s"] / first["later_turn_median_s"])
    assert "first_turn_le_2x_later" in ratios["acceptance"]


def test_fleet_tiny_on_openvino_writes_its_own_json_and_png(tmp_path: Path) -> None:
    """OpenVINO backends and baselines (real runtime, real Ray): no engine-batching row, the
    ratios to it null and said so, every kvres turn completed, the few slots parking through the
    cold store."""
    from benchmarks.fleet.__main__ import main

    main(["--tiny", "--engine", "openvino", "--open-repeats", "1", "--out", str(tmp_path)])
    assert not (tmp_path / "fleet.json").exists()
    saved = json.loads((tmp_path / "fleet-openvino.json").read_text())
    w = saved["workload"]
    assert saved["engine"] == "openvino" and set(saved["rows"]) == set(ROWS) - {"llama_batch", "llama_batch_2_at_once"}
    assert set(saved["baselines"]) == {"slot_baseline", "reprefill_baseline"} and "llama_batch" in saved["not_measured"]
    for name, row in saved["rows"].items():
        assert row["turns_per_s"] > 0 and 0 < row["ttft_p50_ms"] <= row["latency_p50_ms"], name
        if name.startswith("kvres_"):
            assert row["failed_turns"] == 0, row["failures"]
            assert 0 < row["peak_resident_tokens"] <= row["kv_budget_tokens"]
    assert saved["rows"]["slot_baseline"]["turns"] == w["sessions"] * w["turns"]
    assert saved["rows"]["slot_baseline"]["host_ram_state_bytes"] > 0
    assert saved["rows"]["reprefill_baseline"]["recomputed_tokens_per_turn"] >= w["history"]
    few = saved["rows"]["kvres_2_slots"]
    assert few["turns"] == w["sessions"] * w["turns"] and few["resumes_per_turn"] > 0 and few["parked_kv_bytes"]
    ratios = saved["ratios"]
    assert ratios["kvres_2_slots_over_llama_batch"] is None and ratios["acceptance"]["all_slots_ge_0.8x_llama_batch"] is None
    assert ratios["kvres_2_slots_over_slot_baseline"] > 0 and ratios["acceptance"]["few_slots_no_failed_turns"]
    assert (tmp_path / "fleet-openvino.png").stat().st_size > 0


def test_workload_shapes_and_summary() -> None:
    w = Workload(sessions=5, history=10, turns=2, user_tokens=3, reply_tokens=2, users=2, shared_prefix=4)
    assert w.sessions_of(0) == [0, 2, 4] and w.sessions_of(1) == [1, 3]
    assert len(w.schedule()) == w.total_turns == 10 and w.tokens_per_session == 20
    a, b = w.history_of(0, 100), w.history_of(1, 100)
    assert a[:4] == b[:4] and a != b and len(a) == 10 and all(3 <= t < 100 for t in a)
    assert w.user_turn(0, 0, 100) != w.user_turn(0, 1, 100)
    with pytest.raises(ValueError, match="users"):
        Workload(sessions=2, users=3)
    s = summarize([TurnTiming(0, 0, 0.0, 0.1, 1.0), TurnTiming(1, 0, 0.0, 0.2, 3.0)], 4.0)
    assert s["turns_per_s"] == 0.5 and s["latency_p50_ms"] == pytest.approx(2000.0)
