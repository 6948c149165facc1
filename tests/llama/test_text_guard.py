"""A SentencePiece vocabulary without byte tokens would make llama.cpp abort the whole process on
unknown text: the executor refuses text for such a model instead, and token ids still work."""

from __future__ import annotations

import pytest

from kvres.actors.engines.llama import LlamaExecutor
from kvres.policy import CapabilityError
from tests.conftest import REPO_ROOT

PASSKEY_MODEL = REPO_ROOT / "models" / "passkey.gguf"


def test_text_is_refused_without_byte_fallback_and_ids_still_work() -> None:
    if not PASSKEY_MODEL.is_file():
        pytest.fail(f"committed model missing: {PASSKEY_MODEL}", pytrace=False)
    executor = LlamaExecutor(PASSKEY_MODEL, n_ctx=256, n_seq_max=1, n_threads=1)
    with pytest.raises(CapabilityError, match="byte-fallback"):
        executor.tokenize("hello there")
    executor.open_session("s")
    assert executor.append("s", [1, 3, 4, 5]).shape == (executor.n_vocab,)


def test_text_works_with_byte_fallback(stories_model) -> None:
    executor = LlamaExecutor(stories_model, n_ctx=256, n_seq_max=1, n_threads=1)
    assert executor.tokenize("hello")[0] == 1
