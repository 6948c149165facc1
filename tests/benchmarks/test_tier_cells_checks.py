"""The T* table's four PASS checks (``benchmarks.tier_cells.checks``) on made-up cells: each check
passes what the design says and fails what it does not."""

from __future__ import annotations

from typing import Any

from benchmarks.tier_cells.checks import CHECKS, checks_markdown, deterministic, evaluate


def _answers(correct: list[bool], resident: int = 390, spilled: int = 0, recalled: int = 0,
             peak: int = 390) -> list[dict[str, Any]]:
    return [{"family": 1 + i % 2, "correct": c, "resident_tokens": resident, "n_tokens": 384,
             "spilled_bytes": spilled, "recalled_tokens": recalled, "peak_resident_tokens": peak}
            for i, c in enumerate(correct)]


def _cell(name: str, answers: list[dict[str, Any]], decision: dict[str, Any] | None, budget: int = 512
          ) -> dict[str, Any]:
    acc = {f: sum(a["correct"] for a in answers if a["family"] == int(f)) / sum(a["family"] == int(f)
                                                                                for a in answers) for f in ("1", "2")}
    return {"cell": name, "answers": answers, "tier_decision": decision, "kv_budget_tokens": budget, "accuracy": acc}


SPILL = {"chosen": "f16/f16", "chosen_spill_bytes": 1000.0, "predicted_drop": 0.10}


def test_a_run_as_the_design_says_passes_every_check() -> None:
    ok = [True] * 20
    results = [
        _cell("f16 resident", _answers(ok), None),
        _cell("f16 + spill", _answers(ok, resident=96, spilled=4096, recalled=48, peak=96), SPILL, budget=96),
        _cell("q8_0 resident", _answers(ok), None),
        _cell("auto", _answers(ok), {"chosen": "q8_0/q8_0", "chosen_spill_bytes": 0.0, "predicted_drop": 0.0}),
    ]
    rows = [{"cell": "f16 resident", "decode_ratio": 1.0}, {"cell": "f16 + spill", "decode_ratio": 0.93},
            {"cell": "q8_0 resident", "decode_ratio": 0.9},
            {"cell": "auto", "decode_ratio": 0.9, "chose": "q8_0 resident", "same_answers_as_chosen": 1.0,
             "decode_ratio_to_chosen": 0.97}]
    checks = evaluate(results, rows, "f16 resident")
    assert [(c.cell, c.check) for c in checks] == [(r["cell"], name) for r in rows for name in CHECKS]
    status = {(c.cell, c.check): c.status for c in checks}
    assert all(s in ("PASS", "n/a") for s in status.values()), status
    assert status[("f16 + spill", "decode_cost")] == "PASS" and status[("q8_0 resident", "decode_cost")] == "n/a"
    assert status[("auto", "auto_choice")] == "PASS" and status[("f16 resident", "auto_choice")] == "n/a"
    table = checks_markdown(checks)
    assert "| f16 + spill | PASS | PASS | PASS | n/a |" in table
    assert deterministic("retrieval") and deterministic("residency") and not deterministic("decode_cost")


def test_each_check_fails_what_the_design_rules_out() -> None:
    base = _cell("f16 resident", _answers([True] * 20), None)
    lost = _cell("f16 + spill", _answers([False] * 4 + [True] * 16, resident=96, spilled=0, peak=120),
                 SPILL, budget=96)
    slow = {"cell": "f16 + spill", "decode_ratio": 0.5}
    checks = {c.check: c for c in evaluate([base, lost], [{"cell": "f16 resident", "decode_ratio": 1.0}, slow],
                                           "f16 resident") if c.cell == "f16 + spill"}
    assert checks["retrieval"].status == "FAIL" and "family 1" in checks["retrieval"].detail
    assert checks["residency"].status == "FAIL"  # it did not spill, and held more than its budget
    assert checks["decode_cost"].status == "FAIL"  # a drop of 0.5 against a predicted 0.10
    auto = _cell("auto", _answers([True] * 20), None)
    row = {"cell": "auto", "decode_ratio": 1.0, "chose": "f16 resident", "same_answers_as_chosen": 0.9,
           "decode_ratio_to_chosen": 1.0}
    [choice] = [c for c in evaluate([base, auto], [{"cell": "f16 resident", "decode_ratio": 1.0}, row],
                                    "f16 resident") if c.check == "auto_choice" and c.cell == "auto"]
    assert choice.status == "FAIL" and "90%" in choice.detail
