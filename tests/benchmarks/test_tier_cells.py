"""``python -m benchmarks.tier_cells --quick`` runs all four cells through sessions and writes its
JSON, table and PNG (one prompt per family), and evaluates the design's four PASS checks per cell:
those this machine can show (retrieval kept, residency as the tier says, auto giving its chosen
cell's answers) are asserted; the decode-speed ones are evaluated and printed, never asserted (no
wall-clock thresholds in tests)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.tier_cells.checks import CHECKS, deterministic


def test_tier_cells_quick_writes_the_four_cells(tmp_path: Path) -> None:
    from benchmarks.tier_cells.__main__ import main

    result = main(["--quick", "--prompts", "1", "--decode-tokens", "8", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "tier_cells.json").read_text())
    rows = {r["cell"]: r for r in saved["rows"]}
    names = list(rows)
    assert names == [r["cell"] for r in result["rows"]]
    assert names[:3] == ["f16 resident", "f16 + spill", "q8_0 resident"] and names[-1] == "auto"
    # a fifth row only as the twin of auto's choice (f16 spilling at auto's budget)
    assert names[3:-1] in ([], [f"f16 + spill ({saved['meta']['auto_budget_tokens']} tokens)"])
    cells = {c["cell"]: c for c in saved["cells"]}
    assert cells["f16 resident"]["tier_decision"] is None  # f16 fits: nothing chosen
    spill = cells["f16 + spill"]
    assert spill["kv_types"] == ["f16", "f16"] and spill["tier_decision"]["chosen_spill_bytes"] > 0
    assert spill["session_policy"]["kind"] == "streaming" and spill["session_policy"]["spill"] is True
    assert spill["session_policy"]["budget_tokens"] == spill["kv_budget_tokens"] == saved["meta"]["resident_tokens"]
    assert all(a["resident_tokens"] <= spill["kv_budget_tokens"] for a in spill["answers"])
    assert cells["q8_0 resident"]["kv_types"] == ["q8_0", "q8_0"]
    assert cells["auto"]["tier_decision"] is not None and rows["auto"]["chose"] in names[:-1]
    assert rows["auto"]["same_answers_as_chosen"] == 1.0
    checks = {(c["cell"], c["check"]): c for c in saved["checks"]}
    assert set(checks) == {(name, check) for name in names for check in CHECKS}
    for name in names:
        for check in CHECKS:
            status = checks[(name, check)]["status"]
            assert status in ("PASS", "FAIL", "n/a")
            if deterministic(check):
                assert status == "PASS", checks[(name, check)]
    assert checks[("f16 resident", "decode_cost")]["status"] == "n/a"  # resident: T* predicts no drop
    assert checks[("f16 + spill", "decode_cost")]["status"] in ("PASS", "FAIL")
    assert checks[("auto", "auto_choice")]["status"] in ("PASS", "FAIL")
    assert "chose" in checks[("auto", "auto_choice")]["detail"]
    for row in saved["rows"]:
        assert row["decode_tokens_per_s"] > 0 and set(row["accuracy"]) == {"1", "2"}
    assert rows["f16 resident"]["decode_ratio"] == 1.0
    md = (tmp_path / "tier_cells.md").read_text()
    assert "| f16 + spill |" in md and "| cell | retrieval | residency | decode_cost | auto_choice |" in md
    assert (tmp_path / "tier_cells.png").stat().st_size > 0
