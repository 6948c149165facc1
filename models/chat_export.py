"""Export the chat checkpoint (``chat.npz`` + ``chat.json``, no torch) to ``models/chat.gguf``.

Primitives:
- ``vocab_from_config(config) -> Vocab``: the vocabulary a checkpoint config records.
- ``export_chat_gguf(arrays, config, out_path)``: F32 llama-architecture GGUF with the byte-fallback
  "llama" tokenizer and ``tokenizer.chat_template`` (``models.chat_vocab``). No timestamps or paths
  go into the file, so the same checkpoint always gives the same bytes.
- ``export_chat_checkpoint(directory, stem, out_path)``: load the checkpoint and export it.
- CLI: ``python models/chat_export.py [--dir models] [--stem chat] [--out models/chat.gguf]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make "models" importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.chat_vocab import Vocab, add_tokenizer
from models.checkpoint import ModelConfig, load_checkpoint
from models.export_gguf import write_llama_gguf

MODEL_NAME = "kvres-chat"


def vocab_from_config(config: dict[str, Any]) -> Vocab:
    v = config["vocab"]
    vocab = Vocab(tuple(v["tokens"]), tuple(float(s) for s in v["scores"]), tuple(int(t) for t in v["types"]))
    if not len(vocab.tokens) == len(vocab.scores) == len(vocab.types):
        raise ValueError(f"vocab lists differ in length: {len(vocab.tokens)} tokens, {len(vocab.scores)} "
                         f"scores, {len(vocab.types)} types")
    return vocab


def export_chat_gguf(arrays: dict[str, np.ndarray], config: dict[str, Any], out_path: str | Path) -> Path:
    cfg = ModelConfig.from_dict(config["model"])
    vocab = vocab_from_config(config)
    if len(vocab) != cfg.vocab_size:
        raise ValueError(f"config vocab has {len(vocab)} tokens, model expects {cfg.vocab_size}")
    return write_llama_gguf(out_path, MODEL_NAME, cfg, arrays, lambda w: add_tokenizer(w, vocab))


def export_chat_checkpoint(directory: str | Path, stem: str, out_path: str | Path) -> Path:
    arrays, config = load_checkpoint(directory, stem)
    return export_chat_gguf(arrays, config, out_path)


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=str(here), help="checkpoint folder (default: models/)")
    ap.add_argument("--stem", default="chat", help="checkpoint stem: <stem>.npz + <stem>.json")
    ap.add_argument("--out", default=None, help="output GGUF (default: <dir>/<stem>.gguf)")
    args = ap.parse_args(argv)
    out = args.out or str(Path(args.dir) / f"{args.stem}.gguf")
    print(export_chat_checkpoint(args.dir, args.stem, out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
