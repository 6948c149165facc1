"""A minimal llama.cpp session, the yardstick OpenVINO is held to, on ``kvres.actors.engines.llama.engine``.

Primitives:
- ``LlamaNative(model_path, n_ctx=1024, f32_kv=True, n_threads=1)``: one context of two
  sequences (seq 0; seq 1 is scratch); ``decode(tokens, positions, seq=0) -> logits of the last
  token``, ``remove(p0, p1, seq=0)`` (``seq_rm``), ``shift(p0, p1, delta)`` (``seq_add``, llama.cpp
  applies the RoPE K-shift), ``copy(src, dst, p0, p1)``, ``decode_between(tokens, positions)``,
  ``tokenize(text)``, ``clear()``, ``close()``.
- ``NativeSession(engine)``: the executor operations on that sequence, positions kept by the shared
  ``PositionMap`` so they match every executor: ``append``, ``evict_range`` (native rm + shift),
  ``admit_range`` (tail shift, then decode the range over the cells before it), ``rebuild()``
  (clear and re-prefill the resident tokens: what a recompute mechanism does).

f32 KV and flash attention off make it comparable with the f32 OpenVINO graph to ~1e-5. Used by
the OpenVINO tests and the mechanism benchmark; unlike ``LlamaExecutor`` it places tokens where
it is told, with no parking or staging of its own.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from kvres.actors.engines.llama.engine import LlamaContext, LlamaModel
from kvres.policy.positions import PositionMap
from kvres.policy.ranges import Range


class LlamaNative:
    def __init__(self, model_path: str | os.PathLike[str], n_ctx: int = 1024, f32_kv: bool = True,
                 n_threads: int = 1) -> None:
        self.model = LlamaModel(model_path)
        kv_type = "f32" if f32_kv else "f16"
        try:
            self.ctx = LlamaContext(self.model, n_ctx=n_ctx, n_seq_max=2, type_k=kv_type, type_v=kv_type,
                                    flash_attn=False, n_batch=n_ctx, n_threads=n_threads)
        except BaseException:
            self.model.close()
            raise
        self.n_vocab = self.model.n_vocab
        self.n_ctx = n_ctx

    def decode(self, tokens: Sequence[int], positions: Sequence[int], seq: int = 0) -> npt.NDArray[np.float32]:
        n = len(tokens)
        if n == 0 or n != len(positions) or n > self.n_ctx:
            raise ValueError(f"decode needs 1..{self.n_ctx} tokens with as many positions, got {n}")
        first = int(positions[0])
        if [int(p) for p in positions] != list(range(first, first + n)):
            raise ValueError("llama.cpp decodes a batch at consecutive positions only")
        return self.ctx.decode(tokens, first, seq)

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return self.model.tokenize(text, add_bos=add_bos)

    def remove(self, p0: int, p1: int, seq: int = 0) -> None:
        self.ctx.seq_rm(seq, p0, p1)

    def shift(self, p0: int, p1: int, delta: int) -> None:
        self.ctx.seq_add(0, p0, p1, delta)

    def copy(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.ctx.seq_cp(src, dst, p0, p1)

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
        self.ctx.clear()

    def close(self) -> None:
        self.ctx.close()
        self.model.close()

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
