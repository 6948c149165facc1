"""Export the passkey checkpoint (.npz + .json, no torch) to a llama-architecture GGUF.

Primitives:
- ``export_gguf(arrays, config, out_path)``: writes F32 weights, the Llama hyper-parameters and a
  "llama" (SentencePiece-style) tokenizer block (tokens, scores, token types, BOS/EOS/UNK ids).
  No timestamps or paths go into the file, so the same checkpoint always gives the same bytes.
- ``export_checkpoint(directory, stem, out_path)``: load the checkpoint and export it.
- ``write_llama_gguf(out_path, name, cfg, arrays, add_tokenizer)``: the shared part (hyper-parameters,
  F32 tensors) that the chat model's exporter (``models.chat_export``) uses too.
- CLI: ``python models/export_gguf.py [--dir models] [--stem passkey] [--out models/passkey.gguf]``.

Token pieces: words are written SentencePiece-style with a leading "▁" (so llama.cpp detokenizes
them with a space), digits and punctuation without one. Prompts are tokenized with
``models.passkey_tasks.encode``; llama.cpp's own text tokenizer does not reproduce that word
split, so feed it token ids.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make "models" importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gguf

from models.checkpoint import ModelConfig, load_checkpoint, tensor_names

ARCH = "llama"
MODEL_NAME = "kvres-passkey"


def _pieces(vocab: list[str], special: dict[str, int]) -> tuple[list[str], list[float], list[int]]:
    specials = set(special.values())
    tokens, scores, types = [], [], []
    for i, tok in enumerate(vocab):
        if i in specials:
            tokens.append(tok)
            types.append(gguf.TokenType.UNKNOWN if i == special["unk"] else gguf.TokenType.CONTROL)
            scores.append(0.0)
            continue
        word = tok[0].isalpha()
        tokens.append("\u2581" + tok if word else tok)
        types.append(gguf.TokenType.NORMAL)
        scores.append(-float(i))
    return tokens, scores, [int(t) for t in types]


def write_llama_gguf(
    out_path: str | Path,
    name: str,
    cfg: ModelConfig,
    arrays: dict[str, np.ndarray],
    add_tokenizer: Callable[[gguf.GGUFWriter], None],
) -> Path:
    """An F32 llama-architecture GGUF: name, hyper-parameters, the tokenizer block that
    ``add_tokenizer`` writes, then the tensors in ``tensor_names`` order. Written to a temporary
    name and renamed, so a reader never sees half a file."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")

    w = gguf.GGUFWriter(str(tmp), ARCH)
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(cfg.context_length)
    w.add_embedding_length(cfg.d_model)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.d_ff)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(float(cfg.rope_base))
    w.add_layer_norm_rms_eps(float(cfg.rms_eps))
    w.add_vocab_size(cfg.vocab_size)
    add_tokenizer(w)
    for tensor in tensor_names(cfg):
        w.add_tensor(tensor, np.ascontiguousarray(arrays[tensor], dtype=np.float32))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(out_path)
    return out_path


def export_gguf(arrays: dict[str, np.ndarray], config: dict[str, Any], out_path: str | Path) -> Path:
    cfg = ModelConfig.from_dict(config["model"])
    vocab = list(config["vocab"])
    if len(vocab) != cfg.vocab_size:
        raise ValueError(f"config vocab has {len(vocab)} tokens, model expects {cfg.vocab_size}")
    special = {"unk": int(config["unk_id"]), "bos": int(config["bos_id"]), "eos": int(config["eos_id"])}

    def tokenizer(w: gguf.GGUFWriter) -> None:
        tokens, scores, types = _pieces(vocab, special)
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_unk_token_id(special["unk"])
        w.add_bos_token_id(special["bos"])
        w.add_eos_token_id(special["eos"])
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)

    return write_llama_gguf(out_path, MODEL_NAME, cfg, arrays, tokenizer)


def export_checkpoint(directory: str | Path, stem: str, out_path: str | Path) -> Path:
    arrays, config = load_checkpoint(directory, stem)
    return export_gguf(arrays, config, out_path)


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=str(here), help="checkpoint folder (default: models/)")
    ap.add_argument("--stem", default="passkey", help="checkpoint stem: <stem>.npz + <stem>.json")
    ap.add_argument("--out", default=None, help="output GGUF (default: <dir>/<stem>.gguf)")
    args = ap.parse_args(argv)
    out = args.out or str(Path(args.dir) / f"{args.stem}.gguf")
    path = export_checkpoint(args.dir, args.stem, out)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
