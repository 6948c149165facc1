"""The committed chat model (models/chat.gguf), the project's default: byte-exact re-export, its
metadata, and greedy chat in llama.cpp (replies right, ending with EOS, turns prefilled once).

No torch: the checkpoint is .npz + .json and the exporter needs only numpy and gguf. A missing
artifact fails (never skips), naming the path and the command that makes it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvres.actors.default_model import default_model_path, passkey_model_path
from kvres.actors.model_files import gguf_value, open_gguf
from models import chat_tasks as ct
from models import chat_vocab as cv
from models.chat_export import export_chat_checkpoint
from models.checkpoint import load_checkpoint, save_checkpoint, sha256_file

MODELS = Path(__file__).resolve().parents[2] / "models"
GGUF = MODELS / "chat.gguf"
# chat.gguf (CHAT_MANIFEST.json), greedy, f32 KV, the first 20 held-out conversations:
MIN_EXACT_20 = 0.95  # measured 62 of 63 replies (0.984); EOS on all


def _manifest() -> dict:
    path = MODELS / "CHAT_MANIFEST.json"
    if not path.is_file():
        pytest.fail(f"{path} missing: run `python models/train_chat.py`", pytrace=False)
    return json.loads(path.read_text())


def _gguf() -> Path:
    if not GGUF.is_file():
        pytest.fail(f"{GGUF} missing: run `python models/train_chat.py`", pytrace=False)
    return GGUF


def test_manifest_hashes_match_committed_artifacts() -> None:
    for name, entry in _manifest()["artifacts"].items():
        path = MODELS / name
        assert path.is_file(), f"artifact {name} listed in CHAT_MANIFEST.json is missing"
        assert sha256_file(path) == entry["sha256"], f"{name} differs from CHAT_MANIFEST.json"


def test_reexport_is_byte_identical(tmp_path: Path) -> None:
    out = export_chat_checkpoint(MODELS, "chat", tmp_path / "chat.gguf")
    assert out.read_bytes() == _gguf().read_bytes()


def test_checkpoint_save_is_deterministic(tmp_path: Path) -> None:
    arrays, config = load_checkpoint(MODELS, "chat")
    npz, _ = save_checkpoint(tmp_path, "chat", arrays, config)
    assert sha256_file(npz) == sha256_file(MODELS / "chat.npz")
    back, _ = load_checkpoint(tmp_path, "chat")
    assert all(np.array_equal(back[k], arrays[k]) for k in arrays)


def test_gguf_metadata_has_the_template_and_special_tokens() -> None:
    import gguf

    r = open_gguf(_gguf())
    assert gguf_value(r, "general.architecture") == "llama"
    assert gguf_value(r, "tokenizer.ggml.model") == "llama"
    assert gguf_value(r, "tokenizer.chat_template") == cv.CHAT_TEMPLATE
    assert gguf_value(r, "tokenizer.ggml.bos_token_id") == cv.BOS_ID
    assert gguf_value(r, "tokenizer.ggml.eos_token_id") == cv.EOS_ID
    assert gguf_value(r, "tokenizer.ggml.unknown_token_id") == cv.UNK_ID
    assert gguf_value(r, "tokenizer.ggml.add_space_prefix") is False
    tokens = list(gguf_value(r, "tokenizer.ggml.tokens"))
    types = list(gguf_value(r, "tokenizer.ggml.token_type"))
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert tokens[3:259] == [f"<0x{b:02X}>" for b in range(256)]
    assert set(types[3:259]) == {gguf.TokenType.BYTE}
    assert tokens[259:262] == list(cv.ROLE_TOKENS)
    assert set(types[259:262]) == {gguf.TokenType.CONTROL}
    assert tokens == list(cv.build_vocab(ct.corpus_words()).tokens)
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in r.tensors)
    assert _gguf().stat().st_size < 8 << 20


def test_it_is_the_default_model_and_the_demo_keeps_the_passkey_model() -> None:
    assert default_model_path() == _gguf()
    assert passkey_model_path() == MODELS / "passkey.gguf"


def test_engine_tokenizes_any_text() -> None:
    from kvres.actors.engines.llama.engine import LlamaModel

    model = LlamaModel(_gguf(), n_gpu_layers=0)
    try:
        assert model.can_tokenize_text
        for text in ("Hello, wörld! 日本語 🙂\t~", "ß∂ƒ©˙∆˚¬ 🚀🎉 \u0301", "what is 3 plus 4?"):
            ids = model.tokenize(text, add_bos=False)
            assert cv.UNK_ID not in ids and model.detokenize(ids) == text
        rendered = cv.render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
        hi = model.tokenize("hi", add_bos=False)
        assert model.tokenize(rendered, add_bos=True, parse_special=True) == [1, 260, 13, *hi, 2, 13, 261, 13]
        assert model.is_eog(cv.EOS_ID)
    finally:
        model.close()


def test_heldout_replies_are_right_and_end_with_eos() -> None:
    from models.chat_eval import chat_accuracy

    score = chat_accuracy(_gguf(), ct.conversation_set("heldout", 20, seed=7))
    assert score.replies >= 60
    assert score.eos == 1.0, score.misses
    assert score.exact >= MIN_EXACT_20, score.misses


def test_five_turn_chat_prefills_only_each_new_turn() -> None:
    """The session pattern: each turn renders the whole conversation (the model's own replies
    included) and prefills only what the cache lacks; the cache then holds the rendering."""
    from models.chat_eval import LlamaChat

    convs = ct.conversation_set("heldout", 6, seed=11, min_turns=5, max_turns=6)
    with LlamaChat(_gguf()) as chat:
        for conv in convs:
            chat.reset()
            history: list[dict[str, str]] = []
            held = 0  # tokens of the rendering the cache holds (the reply's EOS is not decoded)
            for msg in conv.messages:
                if msg["role"] != "assistant":
                    history.append(msg)
                    continue
                prompt = chat.model.tokenize(cv.render(history, True), add_bos=True, parse_special=True)
                got = chat.reply(history)
                assert got.ended, (history[-1], got.text)
                assert got.prefilled == len(prompt) - held
                history.append({"role": "assistant", "content": got.text})
                held = len(prompt) + len(got.ids)
            whole = chat.model.tokenize(cv.render(history), add_bos=True, parse_special=True)
            assert whole[: len(chat.log)] == chat.log and whole[len(chat.log)] == cv.EOS_ID
