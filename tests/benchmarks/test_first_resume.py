"""``python -m benchmarks.first_resume`` runs and writes what it promises (a small model; no timing
assertions), and the realistic-model writer writes a model llama.cpp loads with the shape asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.realistic_model import REALISTIC, ModelShape, write_realistic_model

SMALL = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--ff", "128", "--vocab", "512"]


def test_first_resume_writes_json_and_png(tmp_path: Path) -> None:
    from benchmarks.first_resume.__main__ import main

    result = main(["--tokens", "64", "--resumes", "3", "--runs", "2", "--threads", "1", *SMALL,
                   "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "first_resume.json").read_text())
    assert saved["ratio"] == result["ratio"] > 0 and saved["bound"] == 2.0
    assert saved["shape"]["n_layer"] == 2 and saved["shape"]["n_vocab"] == 512 and len(saved["runs"]) == 2
    for run in saved["runs"]:  # each on a fresh cluster and probe cache
        assert len(run["resume_s"]) == 3 and run["recomputed_tokens"] == 0  # every block came back by import
        assert set(run["recall_costs_at_resume"]) <= {"probing", "measured"}
        assert run["probe_state"] == "measured"  # the backend measured them, in the background
    firsts = [r["resume_s"][0] for r in saved["runs"]]
    assert saved["first_resume_s"] == pytest.approx(sum(firsts) / 2)  # the median of two
    assert (tmp_path / "first_resume.png").stat().st_size > 0


def test_realistic_model_loads_with_its_shape(tmp_path: Path) -> None:
    from kvres.actors.engines.llama.engine import LlamaModel

    assert REALISTIC.n_layer >= 12 and REALISTIC.n_embd >= 768 and REALISTIC.n_head_kv < REALISTIC.n_head
    assert REALISTIC.n_vocab >= 32000 and REALISTIC.kv_bytes_per_token() == 12 * 2 * 4 * 64 * 2
    shape = ModelShape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=96, n_vocab=600)
    model = LlamaModel(write_realistic_model(tmp_path / "m.gguf", shape))
    try:
        assert (model.n_layer, model.n_embd, model.n_head, model.n_head_kv, model.n_vocab) == (2, 64, 4, 2, 600)
        assert model.detokenize(model.tokenize("hello", add_bos=False)).strip() == "hello"
    finally:
        model.close()
    with pytest.raises(ValueError, match="n_head by n_head_kv"):
        ModelShape(n_head=12, n_head_kv=5)
