"""The mechanism benchmark runs end to end (small sizes) and writes its JSON and PNG."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.openvino_mechanism.__main__ import main


def test_benchmark_writes_json_and_png(stories_gguf: Path, tmp_path: Path) -> None:
    result = main(["--out", str(tmp_path), "--model", str(stories_gguf), "--contexts", "128",
                   "--repeats", "1"])
    saved = json.loads((tmp_path / "openvino_mechanism.json").read_text())
    assert (tmp_path / "openvino_mechanism.png").stat().st_size > 1000
    assert saved["rows"] == json.loads(json.dumps(result["rows"]))
    for row in saved["rows"]:
        assert set(row["ratios"]) == {"ov_recompute/llama_shift", "ov_state/llama_shift", "ov_recompute/ov_state"}
        # state mode is llama's mechanism in numpy; recompute differs by design (survivors recomputed)
        assert row["max_abs_logit_diff_vs_llama"]["ov_state"] <= 1e-4
    methods = saved["engine_eviction"]["methods"]
    assert methods["genai_full"]["agree_with_full_cache"] == saved["engine_eviction"]["new_tokens"]
    assert {"genai_sum", "genai_norm_sum", "kvres_state", "kvres_state_scored"} <= set(methods)
