"""Model files: the one GGUF reader, the one model identity, typed errors for foreign files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from kvres.actors.model_files import model_id, profile_from_gguf, read_gguf_metadata
from kvres.policy import ModelLoadError
from kvres.policy.capacity import LayerKVProfile


def test_profile_from_real_gguf(stories_model: Path) -> None:
    profile = profile_from_gguf(stories_model)
    assert profile == LayerKVProfile(5, 0, 0, 128.0)
    assert profile.kv_bytes_for_context(1) == 640  # the model README: 640 bytes per token at f16
    assert profile_from_gguf(stories_model, "f32", "f32").kv_bytes_for_context(1) == 1280


def test_metadata_values_are_decoded(stories_model: Path) -> None:
    meta = read_gguf_metadata(stories_model)
    assert meta["general.architecture"] == "llama"
    assert meta["llama.block_count"] == 5 and meta["llama.attention.head_count_kv"] == 4
    assert not any(key.startswith("tokenizer.") for key in meta)


def test_model_id_is_the_file_digest(stories_model: Path, tmp_path: Path) -> None:
    assert model_id(stories_model) == "sha256:" + hashlib.sha256(stories_model.read_bytes()).hexdigest()
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(stories_model.read_bytes())
    assert model_id(copy) == model_id(stories_model)  # identity is the content, not the path
    copy.write_bytes(stories_model.read_bytes() + b"\0")
    assert model_id(copy) != model_id(stories_model)  # a changed file is another model


def test_missing_or_foreign_file_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="nope.gguf"):
        profile_from_gguf(tmp_path / "nope.gguf")
    with pytest.raises(ModelLoadError, match="nope.gguf"):
        model_id(tmp_path / "nope.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(ModelLoadError, match="not a GGUF model file"):
        profile_from_gguf(junk)
