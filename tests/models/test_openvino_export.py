"""The passkey model's OpenVINO export (models/openvino/): re-exporting gives the committed bytes,
and openvino-genai's continuous-batching pipeline answers passkeys with it from token ids."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from models import passkey_tasks as pt
from models.export_openvino import export_openvino
from tests.conftest import REPO_ROOT

COMMITTED = REPO_ROOT / "models" / "openvino"
GGUF = REPO_ROOT / "models" / "passkey.gguf"


def _require(path: Path) -> None:
    if not path.exists():
        pytest.fail(f"committed model artifact missing: {path}", pytrace=False)


def test_reexport_gives_the_committed_bytes(tmp_path) -> None:
    _require(COMMITTED)
    _require(GGUF)
    fresh = export_openvino(GGUF, tmp_path / "ov")
    names = sorted(p.name for p in COMMITTED.iterdir())
    assert names == sorted(p.name for p in fresh.iterdir())
    match, mismatch, errors = filecmp.cmpfiles(COMMITTED, fresh, names, shallow=False)
    assert mismatch == [] and errors == [], (mismatch, errors)


def test_genai_pipeline_answers_passkeys_with_full_cache() -> None:
    _require(COMMITTED)
    import openvino_genai

    from kvres.actors.engines.openvino import GenAIEngine

    openvino_genai.LLMPipeline(str(COMMITTED), "CPU")  # the plain pipeline loads the folder too
    engine = GenAIEngine(COMMITTED, num_threads=1)
    tasks = pt.fixed_task_set(1, 20, seed=0, n_tokens=(200, 300), depth=(1 / 3, 2 / 3))
    answers = engine.generate([t.prompt_ids for t in tasks], max_new_tokens=6)
    correct = sum(a[: len(t.answer_ids)] == list(t.answer_ids) for a, t in zip(answers, tasks, strict=True))
    assert correct / len(tasks) >= 0.95, f"{correct}/{len(tasks)} passkeys answered"
