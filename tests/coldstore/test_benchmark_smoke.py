"""The cold-store benchmark runs end to end in its quick mode (structure only, no timing claims)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.coldstore.bench import ACCEPT_SIZE, main


def test_quick_benchmark_writes_ratios_and_a_plot(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["--quick", "--out", str(out), "--work-dir", str(tmp_path)]) == 0
    report = json.loads((out / "coldstore.json").read_text())
    rows = report["results"]
    combos = {(r["tier"], r["op"], r["size_bytes"]) for r in rows}
    assert combos == {
        (tier, op, size)
        for tier in ("ram", "ram_copy", "disk") for op in ("put", "get") for size in report["sizes"]
    }
    for r in rows:
        assert r["blocks"] >= 2 and r["mib_s"] > 0 and r["baseline_mib_s"] > 0
        assert abs(r["ratio"] - r["mib_s"] / r["baseline_mib_s"]) < 1e-9 * r["ratio"]
        assert r["baseline"] in {"numpy_copy", "write_fsync", "read"}
    acc = report["acceptance"]
    assert acc["size_bytes"] == ACCEPT_SIZE and acc["threshold"] == 0.5 and acc["passed"] is None
    assert (out / "coldstore.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # the benchmark cleaned up its files
