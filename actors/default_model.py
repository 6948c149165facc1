"""The project's own default models, so a fresh machine runs without downloading anything.

Primitives:
- ``default_model_path() -> Path``: the trained chat model committed under ``models/``
  (``models/chat.gguf``: byte-fallback vocabulary, a chat template, replies end with EOS) when the
  checkout has it, else ``ensure_tiny_model()``.
- ``passkey_model_path() -> Path``: the trained passkey-retrieval model (``models/passkey.gguf``,
  the demo's and the eviction benchmarks' model) when the checkout has it, else
  ``ensure_tiny_model()``.
- ``ensure_tiny_model(cache_dir=None) -> Path``: a small Llama GGUF written with the ``gguf``
  package (seeded random weights, SentencePiece-style vocabulary with byte fallback), generated
  once and cached under the user cache directory.
- ``write_tiny_model(path, seed=0)``: write it (deterministic bytes). Its head_dim is 32, so
  llama.cpp can also hold its KV as q8_0 / q4_0 (the T* tiers).
- ``model_key(model) -> str``: the name placement knows a model file by, on both sides (what a
  backend reports, what a session asks for): a path to a file here, resolved (a symbolic link or a
  relative path names the file it leads to); anything else (a bare file name, a model id, a path
  to no file here) as given.

The random model speaks nonsense; it exists so the residency machinery has a real llama.cpp
model to run on without downloading anything.
"""

from __future__ import annotations

import os
import string
from pathlib import Path

import numpy as np


def model_key(model: str | os.PathLike[str]) -> str:
    name = os.fspath(model)
    if os.sep not in name:
        return name
    try:
        return str(Path(name).resolve(strict=True))
    except (OSError, RuntimeError):  # no such file here (another node's path), or a link loop
        return name


REPO_MODELS = Path(__file__).resolve().parent.parent / "models"  # a checkout: actors/../models
CHAT_MODEL = REPO_MODELS / "chat.gguf"
PASSKEY_MODEL = REPO_MODELS / "passkey.gguf"

N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF, N_CTX = 64, 2, 2, 1, 128, 4096
_WORDS = ["the", "a", "and", "of", "to", "in", "is", "was", "he", "she", "it", "they", "you", "for", "on", "with", "as", "at", "his", "her", "said", "one", "day", "little", "big", "once", "upon", "time", "there", "story", "cat", "dog", "sun", "tree", "house", "happy", "play", "went", "saw"]


def _vocabulary() -> tuple[list[str], list[float], list[int]]:
    from gguf import TokenType

    tokens = ["<unk>", "<s>", "</s>"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [TokenType.BYTE] * 256
    pieces = ["▁"] + [f"▁{w}" for w in _WORDS] + list(string.ascii_lowercase) + list(".,!?")
    tokens += pieces
    types += [TokenType.NORMAL] * len(pieces)
    scores = [0.0] * (3 + 256) + [-float(i) for i in range(len(pieces))]
    return tokens, scores, [int(t) for t in types]


def write_tiny_model(path: Path, seed: int = 0) -> Path:
    from gguf import GGUFWriter

    tokens, scores, types = _vocabulary()
    rng = np.random.default_rng(seed)
    vocab = len(tokens)

    def weight(*shape: int) -> np.ndarray:
        w: np.ndarray = (rng.standard_normal(shape) * (1.0 / np.sqrt(shape[-1]))).astype(np.float32)
        return w

    tmp = path.with_suffix(".tmp")
    writer = GGUFWriter(str(tmp), "llama")
    writer.add_name("kvres-tiny")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(0)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_tensor("token_embd.weight", weight(vocab, N_EMBD))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("output.weight", weight(vocab, N_EMBD))
    kv = N_EMBD // N_HEAD * N_HEAD_KV
    for i in range(N_LAYER):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(kv, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(kv, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(N_EMBD, N_FF))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)
    return path


def ensure_tiny_model(cache_dir: Path | None = None) -> Path:
    if cache_dir is None:
        from platformdirs import user_cache_dir

        from .settings import read_settings

        cache_dir = read_settings().cache_dir or Path(user_cache_dir("kvres"))
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / "kvres-tiny-v2.gguf"
    if not path.is_file():
        write_tiny_model(path)
    return path


def default_model_path() -> Path:
    return CHAT_MODEL if CHAT_MODEL.is_file() else ensure_tiny_model()


def passkey_model_path() -> Path:
    return PASSKEY_MODEL if PASSKEY_MODEL.is_file() else ensure_tiny_model()
