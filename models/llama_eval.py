"""Passkey accuracy of a GGUF in llama.cpp (``kvres.actors.engines.llama.engine``; no torch).

Primitives:
- ``LlamaGreedy(gguf_path, n_ctx=512, n_threads=2)``: one model + context; ``greedy(prompt_ids, n)``
  clears the KV cache, prefills the prompt with a full cache and greedy-decodes ``n`` tokens.
- ``llama_passkey_accuracy(gguf_path, tasks) -> float``: exact match of every answer digit.

F32 KV cache, flash attention off and no GPU layers, so results compare with torch at float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kvres.actors.engines.llama.engine import LlamaContext, LlamaModel
from models import passkey_tasks as pt


class LlamaGreedy:
    def __init__(self, gguf_path: str | Path, n_ctx: int = 512, n_threads: int = 2) -> None:
        path = Path(gguf_path)
        if not path.is_file():
            raise FileNotFoundError(f"GGUF not found: {path}")
        self.model = LlamaModel(path, n_gpu_layers=0)
        try:
            self.ctx = LlamaContext(self.model, n_ctx=n_ctx, type_k="f32", type_v="f32", flash_attn=False,
                                    n_batch=n_ctx, n_threads=n_threads)
        except BaseException:
            self.model.close()
            raise
        self.n_ctx = n_ctx

    def greedy(self, prompt_ids: Sequence[int], n: int) -> list[int]:
        if len(prompt_ids) + n > self.n_ctx:
            raise ValueError(f"prompt of {len(prompt_ids)} + {n} tokens exceeds n_ctx {self.n_ctx}")
        self.ctx.clear()
        logits = self.ctx.decode(prompt_ids, 0, 0)
        out: list[int] = []
        for pos in range(len(prompt_ids), len(prompt_ids) + n):
            out.append(int(np.argmax(logits)))
            if len(out) < n:
                logits = self.ctx.decode(out[-1:], pos, 0)
        return out

    def close(self) -> None:
        self.ctx.close()
        self.model.close()

    def __enter__(self) -> LlamaGreedy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def llama_passkey_accuracy(
    gguf_path: str | Path, tasks: Sequence[pt.PasskeyTask], n_threads: int = 2
) -> float:
    """Greedy exact-match accuracy with a full cache."""
    if not tasks:
        raise ValueError("no tasks")
    with LlamaGreedy(gguf_path, n_threads=n_threads) as llm:
        ok = sum(llm.greedy(t.prompt_ids, len(t.answer_ids)) == t.answer_ids for t in tasks)
    return ok / len(tasks)
