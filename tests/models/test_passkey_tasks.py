"""The passkey task generator and word tokenizer (models/passkey_tasks.py): pure, no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from models import passkey_tasks as pt


def test_vocab_specials_and_round_trip() -> None:
    assert pt.VOCAB[pt.UNK_ID] == "<unk>" and pt.VOCAB[pt.BOS_ID] == "<s>" and pt.VOCAB[pt.EOS_ID] == "</s>"
    assert len(set(pt.VOCAB)) == len(pt.VOCAB) < 256
    text = "the pass key of anna is 48213 . what is the pass key ?"
    ids = pt.encode(text, bos=True)
    assert ids[0] == pt.BOS_ID
    assert pt.decode(ids) == text
    assert pt.encode("48213") == [pt.TOKEN_TO_ID[c] for c in "48213"]


def test_unknown_word_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="zebra"):
        pt.encode("the zebra")


@pytest.mark.parametrize("family", [1, 2])
@pytest.mark.parametrize("n_tokens", [80, 257, 400])
@pytest.mark.parametrize("depth", [0.0, 0.37, 0.5, 1.0])
def test_exact_length_and_spans(family: int, n_tokens: int, depth: float) -> None:
    t = pt.make_task(family, seed=11, n_tokens=n_tokens, depth=depth, n_needles=3)
    assert t.n_tokens == n_tokens and t.prompt_ids[0] == pt.BOS_ID
    assert pt.BOS_ID not in t.prompt_ids[1:] and pt.EOS_ID not in t.prompt_ids
    q0, q1 = t.question_span
    assert q1 == n_tokens
    question = pt.decode(t.prompt_ids[q0:q1])
    assert question.startswith("what is the pass key") and question.endswith("is")
    needle = t.prompt_ids[slice(*t.target_span)]
    assert t.answer_ids == needle[-len(t.answer_ids) - (4 if family == 1 else 1) :][: len(t.answer_ids)]
    if family == 2:
        assert f"of {t.keys[t.target]} is" in pt.decode(needle)
        assert f"of {t.keys[t.target]} ?" in question
        spans = sorted(t.needle_spans)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))  # needles never overlap
    # the target sits near its requested depth (within one filler sentence)
    n_fill = n_tokens - 1 - sum(b - a for a, b in t.needle_spans) - (q1 - q0)
    before = sum(1 for p in range(1, t.target_span[0]) if not any(a <= p < b for a, b in t.needle_spans))
    assert abs(before - depth * n_fill) <= 11


def test_same_seed_same_prompt_and_sets() -> None:
    a = pt.fixed_task_set(2, 10, seed=3, n_needles=(2, 6))
    b = pt.fixed_task_set(2, 10, seed=3, n_needles=(2, 6))
    assert [t.prompt_ids for t in a] == [t.prompt_ids for t in b]
    assert len({tuple(t.prompt_ids) for t in a}) == 10
    mid = pt.fixed_task_set(1, 50, seed=0, depth=(1 / 3, 2 / 3))
    assert all(1 / 3 <= t.depth <= 2 / 3 for t in mid)
    assert all(200 <= t.n_tokens <= 400 for t in mid)


def test_multi_needles_have_distinct_keys_and_answers() -> None:
    for seed in range(20):
        t = pt.make_task(2, seed, 300, n_needles=6)
        assert len(set(t.keys)) == 6
        answers = {tuple(t.prompt_ids[b - 1 - len(t.answer_ids) : b - 1]) for _, b in t.needle_spans}
        assert len(answers) == 6


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="too short"):
        pt.make_task(2, 0, 40, n_needles=6)
    with pytest.raises(ValueError, match="depth"):
        pt.make_task(1, 0, 100, depth=1.5)
    with pytest.raises(ValueError, match="family"):
        pt.make_task(3, 0, 100)


def test_models_modules_import_no_torch() -> None:
    code = (
        "import sys\n"
        "import models.passkey_tasks, models.checkpoint, models.export_gguf\n"
        "print('torch' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "False"
