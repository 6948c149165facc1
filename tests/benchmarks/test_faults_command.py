"""``python -m benchmarks.faults --quick`` runs its scenarios on a fresh local cluster and writes
the table it promises (no timing assertions): no scenario breaks, no committed token is lost, the
greedy tokens after each fault are the fault-free ones."""

from __future__ import annotations

import json

from tests.conftest import shared_model_path


def test_faults_quick_writes_the_table_json_and_png(tmp_path, capsys) -> None:
    from benchmarks.faults.__main__ import QUICK, main

    result = main(["--quick", "--model", str(shared_model_path()), "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "faults.json").read_text())
    assert [r["name"] for r in saved["rows"]] == list(QUICK) == [r["name"] for r in result["rows"]]
    for row in saved["rows"]:
        assert not row["error"].startswith("scenario failed"), row
        assert row["tokens_lost"] == 0 and row["same_tokens"], row
        assert row["recover_s"] > 0 and row["baseline_s"] > 0, row
    errors = {r["name"]: r["error"] for r in saved["rows"]}
    assert errors["append-past-budget"] == "BackendFullError"  # the one fault the driver must hear of
    damaged = next(r for r in saved["rows"] if r["name"] == "damaged-files")
    assert damaged["tokens_recomputed"] > 0 and damaged["note"] == "imported none: True"
    assert saved["tokens_lost"] == 0
    assert (tmp_path / "faults.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "| scenario | error seen | sessions lost | continuations identical | tokens lost |" in printed
    rows = {r["name"]: r for r in saved["rows"]}
    assert rows["bad-arguments"]["error"] == "none" and "backend crashes: 0" in rows["bad-arguments"]["note"]
    assert rows["abandoned-stream"]["note"].startswith("committed 5 of ")
    assert saved["sessions_lost"] == 0 and all(r["identical"] == r["sessions"] for r in saved["rows"])
