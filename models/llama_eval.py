"""Passkey accuracy of a GGUF in llama.cpp (llama-cpp-python, low-level API; no torch).

Primitives:
- ``LlamaGreedy(gguf_path, n_ctx=512, n_threads=2)``: one model + context; ``greedy(prompt_ids, n)``
  clears the KV cache, prefills the prompt with a full cache and greedy-decodes ``n`` tokens.
- ``llama_passkey_accuracy(gguf_path, tasks) -> float``: exact match of every answer digit.

F32 KV cache and flash attention off, so results compare with torch at float32.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Sequence
from pathlib import Path

import llama_cpp
import numpy as np

from models import passkey_tasks as pt

_BACKEND_READY = False


class LlamaGreedy:
    def __init__(self, gguf_path: str | Path, n_ctx: int = 512, n_threads: int = 2) -> None:
        global _BACKEND_READY
        path = Path(gguf_path)
        if not path.is_file():
            raise FileNotFoundError(f"GGUF not found: {path}")
        if not _BACKEND_READY:
            llama_cpp.llama_backend_init()
            _BACKEND_READY = True
        llama_cpp.llama_log_set(_quiet_log, ctypes.c_void_p(0))
        mp = llama_cpp.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_ctx
        cp.n_ubatch = n_ctx
        cp.n_seq_max = 1
        cp.n_threads = n_threads
        cp.n_threads_batch = n_threads
        cp.type_k = 0  # GGML_TYPE_F32
        cp.type_v = 0
        cp.flash_attn_type = 0  # disabled
        self.ctx = llama_cpp.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.n_ctx = n_ctx
        vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        self.batch = llama_cpp.llama_batch_init(n_ctx, 0, 1)

    def _decode(self, ids: Sequence[int], pos0: int) -> np.ndarray:
        b = self.batch
        b.n_tokens = len(ids)
        for i, tok in enumerate(ids):
            b.token[i] = int(tok)
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = i == len(ids) - 1
        rc = llama_cpp.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def greedy(self, prompt_ids: Sequence[int], n: int) -> list[int]:
        if len(prompt_ids) + n > self.n_ctx:
            raise ValueError(f"prompt of {len(prompt_ids)} + {n} tokens exceeds n_ctx {self.n_ctx}")
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), True)
        logits = self._decode(prompt_ids, 0)
        out: list[int] = []
        pos = len(prompt_ids)
        for _ in range(n):
            tok = int(np.argmax(logits))
            out.append(tok)
            if len(out) == n:
                break
            logits = self._decode([tok], pos)
            pos += 1
        return out

    def close(self) -> None:
        if getattr(self, "batch", None) is not None:
            llama_cpp.llama_batch_free(self.batch)
            self.batch = None
        if getattr(self, "ctx", None):
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            llama_cpp.llama_model_free(self.model)
            self.model = None

    def __enter__(self) -> LlamaGreedy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@llama_cpp.llama_log_callback
def _quiet_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    if level == 4:  # GGML_LOG_LEVEL_ERROR; drop debug/info/warn chatter
        sys.stderr.write(text.decode("utf-8", errors="replace"))


def llama_passkey_accuracy(
    gguf_path: str | Path, tasks: Sequence[pt.PasskeyTask], n_threads: int = 2
) -> float:
    """Greedy exact-match accuracy with a full cache."""
    if not tasks:
        raise ValueError("no tasks")
    with LlamaGreedy(gguf_path, n_threads=n_threads) as llm:
        ok = sum(llm.greedy(t.prompt_ids, len(t.answer_ids)) == t.answer_ids for t in tasks)
    return ok / len(tasks)
