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
