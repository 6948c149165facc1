"""``python -m benchmarks.tier_choice`` runs and writes what it promises (probes pinned by env)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_tier_choice_benchmark_writes_json_and_png(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.tier_choice.bench import main

    for name, value in {"KVRES_CACHE_DIR": str(tmp_path / "cache"), "KVRES_HOST_RAM_GBPS": "10",
                        "KVRES_VRAM_GBPS": "10", "KVRES_C_ENGAGE_MS": "0.5"}.items():
        monkeypatch.setenv(name, value)
    assert main(["--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "tier_choice.json").read_text())
    detail = report["c_engage_detail"]
    assert detail["tail_tokens"][0] == 0 and detail["tail_bytes"][0] == 0
    assert len(detail["extra_step_s"]) == len(detail["tail_tokens"])
    assert report["probes"]["c_engage_ms"] == 0.5 and report["probes"]["sources"]["c_engage_ms"] == "env"
    qwen = [r for r in report["decisions"] if r["series"].startswith("qwen2.5-14b layout @ ref-3090")]
    assert {r["weights_active_bytes"] for r in qwen} == {14.87e9}
    assert (tmp_path / "tier_choice.png").stat().st_size > 0
