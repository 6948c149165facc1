"""``benchmarks.recall_cost --quick`` runs both engines through sessions and writes what it promises
(no timing assertions: the bound is checked by the full run, see docs/notes.md)."""

from __future__ import annotations

import json


def test_recall_cost_quick_writes_json_and_png(tmp_path) -> None:
    from benchmarks.recall_cost.__main__ import main

    result = main(["--quick", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "recall_cost.json").read_text())
    assert [(r["engine"], r["block_size"]) for r in saved["rows"]] == [("llama.cpp", 4), ("openvino", 4)]
    assert len(result["rows"]) == 2 and saved["bound"] == 0.1
    for row in saved["rows"]:
        assert row["recall_s"] > 0 and row["plain_s"] > 0 and row["reprefill_s"] > 0
        assert row["ratio"] == row["recall_cost_s"] / row["reprefill_s"]
        assert row["pause_between_turns_s"] == saved["pause_between_turns_s"] == 0.1
        assert row["ratio_back_to_back"] == row["recall_cost_back_to_back_s"] / row["reprefill_s"]
        assert row["recall_back_to_back_s"] > 0 and row["plain_back_to_back_s"] > 0
        assert row["blocks_recalled"] > 0  # the question brought spilled blocks back
        assert row["backend_prep_s"] > 0  # prepared while the driver paused between the turns
        assert row["answer_right"]["recall"] == 1.0 and row["answer_right"]["plain"] == 0.0
    assert (tmp_path / "recall_cost.png").stat().st_size > 0
