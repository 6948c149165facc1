"""The benchmark commands run and write what they promise (small sizes; no timing assertions)."""

from __future__ import annotations

import json

from tests.conftest import shared_model_path


def test_plan_scaling_writes_json_and_png(tmp_path) -> None:
    from benchmarks.plan_scaling.__main__ import main

    result = main(["--out", str(tmp_path), "--max-blocks", "10000"])
    saved = json.loads((tmp_path / "plan_scaling.json").read_text())
    assert [r["blocks"] for r in saved["rows"]] == [100, 1_000, 10_000]
    assert saved["growth_exponent"] == result["growth_exponent"] > 0
    assert (tmp_path / "plan_scaling.png").stat().st_size > 0


def test_session_overhead_decodes_the_same_tokens_both_ways(tmp_path) -> None:
    from benchmarks.session_overhead.__main__ import main

    result = main(["--model", str(shared_model_path()), "--repeats", "1", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "session_overhead.json").read_text())
    assert saved["ratio"] == result["ratio"] > 0 and saved["bound"] == 1.15
    assert (tmp_path / "session_overhead.png").stat().st_size > 0


def test_passkey_runs_every_engine_and_policy_through_sessions(tmp_path) -> None:
    from benchmarks.passkey.__main__ import main

    result = main(["--quick", "--per-cell", "1", "--cost-tokens", "16", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "passkey.json").read_text())
    ran = {(r["engine"], r["method"], r["budget"]) for r in saved["records"]}
    for engine in ("llama.cpp", "openvino"):
        for method in ("streaming", "snapkv", "h2o", "keynorm"):
            assert {(engine, method, b) for b in (0.1, 0.25, 0.5)} <= ran
        assert (engine, "full", 1.0) in ran
        costs = saved["cost"][engine]["methods"]
        assert costs["streaming"]["generate_ratio"] == 1.0 and all(c["generate_s"] > 0 for c in costs.values())
    # genai's own eviction cannot go below 96 tokens: not at 10% of 384, but at 25% and 50%
    assert {m for e, m, b in ran if e == "openvino-genai" and b == 0.1} == set()
    assert {("openvino-genai", "genai", 0.25), ("openvino-genai", "genai", 0.5)} <= ran
    # SnapKV on a backend whose room is a third of the prompt: where its budget leaves room to compress
    assert {b for e, m, b in ran if m == "snapkv-3x"} == {0.1, 0.25}
    for budget in (0.1, 0.25):  # scored by the prompt's own last tokens: as many needles as when it fits
        hits = {m: sum(r["correct"] for r in saved["records"] if r["method"] == m and r["budget"] == budget
                       and r["engine"] == "llama.cpp") for m in ("snapkv", "snapkv-3x")}
        assert hits["snapkv-3x"] >= hits["snapkv"]
    assert len(saved["records"]) == len(result["records"]) == 3 * (2 * 13 + 3 + 2)
    assert "| 10% |" in (tmp_path / "passkey.md").read_text()
    assert (tmp_path / "passkey.png").stat().st_size > 0


def test_concurrency_writes_json_and_png(tmp_path) -> None:
    from benchmarks.concurrency.__main__ import main

    result = main(["--sessions", "1,2", "--tokens", "8", "--prompt", "16", "--repeats", "1",
                   "--threads", "1", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "concurrency.json").read_text())
    assert [r["sessions"] for r in saved["rows"]] == [1, 2] == [r["sessions"] for r in result["rows"]]
    assert all(r["tokens_per_s"] > 0 and r["engine_tokens_per_s"] > 0 for r in saved["rows"])
    assert all(r["paired_ratio_to_baseline"] == r["runs"][0]["tokens_per_s"] / r["baseline_runs"][0]
               for r in saved["rows"])  # one repeat: its own ratio
    assert (tmp_path / "concurrency.png").stat().st_size > 0


def test_concurrency_on_openvino_compares_with_sessions_one_after_another(tmp_path) -> None:
    from benchmarks.concurrency.__main__ import main

    main(["--engine", "openvino", "--sessions", "1,2", "--tokens", "8", "--prompt", "16", "--repeats", "1",
          "--threads", "1", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "concurrency-openvino.json").read_text())
    assert saved["engine"] == "openvino" and saved["baseline"] == "the same sessions one after another"
    assert [r["sessions"] for r in saved["rows"]] == [1, 2]
    assert all(r["tokens_per_s"] > 0 and r["baseline_tokens_per_s"] > 0 and "engine_tokens_per_s" not in r
               for r in saved["rows"])
    assert (tmp_path / "concurrency-openvino.png").stat().st_size > 0


def test_suspend_resume_writes_json_and_png(tmp_path) -> None:
    from benchmarks.suspend_resume.__main__ import main

    main(["--lengths", "64", "--repeats", "1", "--threads", "1", "--out", str(tmp_path)])
    row = json.loads((tmp_path / "suspend_resume.json").read_text())["rows"][0]
    assert row["tokens"] == 64 and row["recomputed_tokens"] == 0  # every block came back by import
    assert row["cycle_over_engine"] > 0 and row["reprefill_over_resume"] > 0
    assert (tmp_path / "suspend_resume.png").stat().st_size > 0
