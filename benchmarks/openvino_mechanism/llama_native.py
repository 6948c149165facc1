"""A minimal llama.cpp session over the low-level ``llama_cpp`` API: the yardstick OpenVINO is held to.

Primitives:
- ``LlamaNative(model_path, n_ctx=1024, f32_kv=True)``: one context, one sequence (seq 0);
  ``decode(tokens, positions) -> logits of the last token``, ``remove(p0, p1)``
  (``llama_memory_seq_rm``), ``shift(p0, p1, delta)`` (``llama_memory_seq_add``, llama.cpp applies
  the RoPE K-shift), ``tokenize(text)``, ``clear()``, ``close()``.
- ``NativeSession(engine)``: the executor operations on that sequence, positions kept by the shared
  ``PositionMap`` so they match every executor: ``append``, ``evict_range`` (native rm + shift),
  ``admit_range`` (tail shift, then decode the range over the cells before it), ``rebuild()``
  (clear and re-prefill the resident tokens: what a recompute mechanism does).

f32 KV (``type_k = type_v = 0``) and flash attention off (``flash_attn_type = 0``) make it
comparable with the f32 OpenVINO graph to ~1e-5. Used by the OpenVINO tests and the mechanism
benchmark while the project's own llama executor is written elsewhere.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from kvres.policy.positions import PositionMap
from kvres.policy.ranges import Range

_SILENT = None


def _silence(llama_cpp: object) -> None:
    global _SILENT
    if _SILENT is None:
        @ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
        def _quiet(level: int, text: bytes, user: object) -> None:
            return None

        _SILENT = _quiet
        llama_cpp.llama_log_set(_SILENT, None)  # type: ignore[attr-defined]


class LlamaNative:
    def __init__(self, model_path: str | os.PathLike[str], n_ctx: int = 1024, f32_kv: bool = True,
                 n_threads: int = 1) -> None:
        import llama_cpp as L

        self._L = L
        _silence(L)
        L.llama_backend_init()
        mparams = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(str(model_path).encode(), mparams)
        if not self.model:
            raise ValueError(f"llama.cpp could not load {str(model_path)!r}")
        cparams = L.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_ctx
        cparams.n_ubatch = n_ctx
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        cparams.flash_attn_type = 0
        cparams.n_seq_max = 2  # seq 1 is scratch for admissions into the middle of seq 0
        cparams.kv_unified = True
        if f32_kv:
            cparams.type_k = 0
            cparams.type_v = 0
        self.ctx = L.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise ValueError("llama.cpp could not create a context")
        self.mem = L.llama_get_memory(self.ctx)
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.n_ctx = n_ctx
        self.batch = L.llama_batch_init(n_ctx, 0, 1)

    def decode(self, tokens: Sequence[int], positions: Sequence[int], seq: int = 0) -> npt.NDArray[np.float32]:
        L, b = self._L, self.batch
        n = len(tokens)
        if n == 0 or n != len(positions) or n > self.n_ctx:
            raise ValueError(f"decode needs 1..{self.n_ctx} tokens with as many positions, got {n}")
        b.n_tokens = n
        for i, (t, p) in enumerate(zip(tokens, positions, strict=True)):
            b.token[i] = int(t)
            b.pos[i] = int(p)
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = 1 if i == n - 1 else 0
        rc = L.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        ptr = L.llama_get_logits_ith(self.ctx, n - 1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).astype(np.float32).copy()

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        L = self._L
        data = text.encode("utf-8")
        buf = (L.llama_token * (len(data) + 8))()
        n = L.llama_tokenize(L.llama_model_get_vocab(self.model), data, len(data), buf, len(buf), add_bos, False)
        if n < 0:
            raise ValueError(f"llama_tokenize needs {-n} slots")
        return list(buf[:n])

    def remove(self, p0: int, p1: int, seq: int = 0) -> None:
        if not self._L.llama_memory_seq_rm(self.mem, seq, p0, p1):
            raise RuntimeError(f"llama_memory_seq_rm refused [{p0}, {p1})")

    def shift(self, p0: int, p1: int, delta: int) -> None:
        self._L.llama_memory_seq_add(self.mem, 0, p0, p1, delta)

    def copy(self, src: int, dst: int, p0: int, p1: int) -> None:
        self._L.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def decode_between(self, tokens: Sequence[int], positions: Sequence[int]) -> None:
        """Decode tokens into the middle of seq 0: over a scratch copy of the cells before them.

        llama.cpp needs a batch's positions to continue the sequence's last one, so the scratch
        sequence holds only the prefix; the new cells are then copied into seq 0.
        """
        first, last = int(positions[0]), int(positions[-1])
        self.remove(-1, -1, seq=1)
        self.copy(0, 1, 0, first)
        try:
            self.decode(tokens, positions, seq=1)
            self.copy(1, 0, first, last + 1)
        finally:
            self.remove(-1, -1, seq=1)

    def clear(self) -> None:
        self._L.llama_memory_clear(self.mem, True)

    def close(self) -> None:
        L = self._L
        if self.ctx:
            L.llama_batch_free(self.batch)
            L.llama_free(self.ctx)
            L.llama_model_free(self.model)
            self.ctx = None
            self.model = None

    def __enter__(self) -> LlamaNative:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NativeSession:
    def __init__(self, engine: LlamaNative) -> None:
        self.engine = engine
        self.tokens: list[int] = []
        self.positions = PositionMap()
        engine.clear()

    def append(self, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        first = self.positions.append(len(tokens))
        self.tokens.extend(int(t) for t in tokens)
        return self.engine.decode(tokens, range(first, first + len(tokens)))

    def evict_range(self, rng: Range, rebase: bool = False) -> None:
        op = self.positions.evict(rng, rebase)
        self.engine.remove(op.p0, op.p1)
        if op.shift:
            self.engine.shift(op.p1, -1, op.shift)

    def admit_range(self, rng: Range) -> None:
        op = self.positions.admit(rng)
        if op.tail_shift:
            self.engine.shift(op.tail_from, -1, op.tail_shift)
        self.engine.decode_between(self.tokens[rng.start : rng.end], op.positions)

    def rebuild(self) -> None:
        """Clear and re-prefill the resident tokens. llama.cpp refuses position gaps inside a
        batch or between batches, so this needs the resident positions to be contiguous."""
        mask = self.positions.resident_mask()
        positions = self.positions.all_positions()[mask]
        if positions.size and np.any(np.diff(positions) != 1):
            raise ValueError("llama.cpp cannot re-prefill tokens whose positions have gaps")
        self.engine.clear()
        tokens = np.asarray(self.tokens)[mask].tolist()
        if tokens:
            self.engine.decode(tokens, positions.tolist())
