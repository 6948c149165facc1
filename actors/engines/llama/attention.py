"""Attention capture on llama.cpp: the softmaxed attention of chosen query tokens.

Primitives:
- ``AttentionRecorder``: a ``cb_eval`` callback that, while ``active``, copies every
  ``kq_soft_max-<layer>`` tensor the graph computes and lets every other node run unobserved.
- ``ScoringContext(model, n_ctx, n_batch, n_threads)``: a second context on the same model with
  flash attention off (the only mode that materialises the softmax) and f16 KV.
  ``capture(tokens, key_positions, window) -> AttentionCapture`` re-prefills ``tokens`` from an
  empty cache and records the attention of the last ``window`` of them (``probs`` of shape
  (n_layer, n_head, n_query, n_key), keys and query rows labelled by token-log index).
  ``capture_after(blob, n_cells, tokens, first_pos, key_positions, window)`` restores a state blob
  (this context's layout: f16, V transposed; cells in position order) instead of re-prefilling,
  decodes ``tokens`` after it from ``first_pos`` and records the attention of their last
  ``window``: what a recall scores cold blocks by, at the cost of the new tokens only.
  ``load(blob, n_cells, holder)`` restores the blob ahead of time; a ``capture_after(...,
  holder=holder)`` that comes before any other use of the context starts from it.

Why a second context: the serving context keeps flash attention (faster, and required for a
quantized V cache), so its attention matrix never exists in memory. The scoring context starts
empty for every capture, so KV cell i holds the i-th given token and the key axis needs no
cell-to-position mapping. Tokens are placed at consecutive positions 0..n-1: llama.cpp only
accepts a decode that continues a sequence at its last position + 1, so a session whose cache
has position gaps (eviction without re-basing) is scored as if it had been re-based. Rotary
attention depends on relative distance only, so a gap-free session is scored at its exact
geometry.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kvres.policy.scoring import AttentionCapture

from .engine import LlamaContext, LlamaModel
from .ggml_tensors import read_f32, tensor_name
from .library import eval_callback
from .llama_errors import EngineError

_KQ_SOFTMAX = re.compile(r"kq_soft_max-(\d+)$")


class AttentionRecorder:
    def __init__(self) -> None:
        self.active = False
        self.captured: dict[int, list[npt.NDArray[np.float32]]] = {}
        self.error: BaseException | None = None
        self.callback = eval_callback(self._on_node)

    def reset(self) -> None:
        self.captured = {}
        self.error = None

    def _on_node(self, tensor: int, ask: bool, _user: Any) -> bool:
        # An exception must not escape into C: record it and keep the graph running.
        try:
            if not self.active:
                return not ask
            match = _KQ_SOFTMAX.match(tensor_name(tensor))
            if ask:
                return match is not None
            if match is not None:
                self.captured.setdefault(int(match.group(1)), []).append(read_f32(tensor))
        except BaseException as exc:  # noqa: BLE001 - re-raised after the decode returns
            self.error = exc
        return True


class ScoringContext:
    def __init__(self, model: LlamaModel, n_ctx: int, n_batch: int, n_threads: int) -> None:
        self.model = model
        self.recorder = AttentionRecorder()
        self.ctx = LlamaContext(
            model, n_ctx=n_ctx, n_seq_max=1, type_k="f16", type_v="f16", flash_attn=False,
            n_batch=n_batch, n_threads=n_threads, cb_eval=self.recorder.callback,
        )
        self.holding: object | None = None  # whose blob ``load`` restored (until the context is used)

    def load(self, blob: bytes, n_cells: int, holder: object) -> None:
        self.holding = None
        self.ctx.clear()
        if n_cells and not self.ctx.state_set(0, blob):
            self.ctx.clear()
            raise EngineError(f"the scoring context refused a state of {n_cells} cells")
        self.holding = holder

    def close(self) -> None:
        self.ctx.close()

    def capture(
        self, tokens: Sequence[int], key_positions: npt.ArrayLike, window: int
    ) -> AttentionCapture:
        n = len(tokens)
        keys = np.asarray(key_positions, dtype=np.int64)
        if keys.shape != (n,):
            raise ValueError(f"{keys.shape[0]} key positions for {n} tokens")
        if n == 0:
            raise ValueError("attention capture needs at least one token")
        if n > self.ctx.n_cells:
            raise ValueError(f"{n} tokens do not fit the scoring context of {self.ctx.n_cells} cells")
        window = max(1, min(int(window), n, self.ctx.n_batch))
        head = n - window
        self.holding = None
        self.ctx.clear()
        try:
            if head:
                self.ctx.decode(tokens[:head], 0, 0, logits=False)
            self.recorder.reset()
            self.recorder.active = True
            try:
                self.ctx.decode(tokens[head:], head, 0, logits=False)
            finally:
                self.recorder.active = False
            if self.recorder.error is not None:
                raise EngineError(f"attention capture failed: {self.recorder.error!r}")
            probs = self._stack(n, window)
        finally:
            self.ctx.clear()
        return AttentionCapture(probs, keys, keys[head:].copy())

    def capture_after(
        self, blob: bytes, n_cells: int, tokens: Sequence[int], first_pos: int, key_positions: npt.ArrayLike,
        window: int, holder: object | None = None,
    ) -> tuple[AttentionCapture, npt.NDArray[np.float32], bytes]:
        """The capture, the last token's logits and the state blob of the tokens' own cells (the
        blob is not restored again when ``load`` restored it for ``holder``)."""
        n_tok = len(tokens)
        n_keys = n_cells + n_tok
        keys = np.asarray(key_positions, dtype=np.int64)
        if keys.shape != (n_keys,):
            raise ValueError(f"{keys.shape[0]} key positions for {n_cells} cells and {n_tok} tokens")
        if n_tok == 0:
            raise ValueError("attention capture needs at least one token")
        if n_keys > self.ctx.n_cells:
            raise ValueError(f"{n_keys} keys do not fit the scoring context of {self.ctx.n_cells} cells")
        window = max(1, min(int(window), n_tok, self.ctx.n_batch))
        head = n_tok - window
        loaded, self.holding = holder is not None and self.holding is holder, None
        if not loaded:
            self.ctx.clear()
        try:
            if not loaded and n_cells and not self.ctx.state_set(0, blob):
                raise EngineError(f"the scoring context refused a state of {n_cells} cells")
            if head:
                self.ctx.decode(tokens[:head], first_pos, 0, logits=False)
            self.recorder.reset()
            self.recorder.active = True
            try:
                logits = self.ctx.decode(tokens[head:], first_pos + head, 0)
            finally:
                self.recorder.active = False
            if self.recorder.error is not None:
                raise EngineError(f"attention capture failed: {self.recorder.error!r}")
            probs = self._stack(n_keys, window)
            self.ctx.seq_rm(0, 0, first_pos)  # what stays: the tokens' own cells
            own = self.ctx.state_get(0)
        finally:
            self.ctx.clear()
        return AttentionCapture(probs, keys, keys[n_keys - window :].copy()), logits, own

    def _stack(self, n_keys: int, window: int) -> npt.NDArray[np.float32]:
        captured = self.recorder.captured
        if sorted(captured) != list(range(self.model.n_layer)):
            raise EngineError(
                f"captured kq_soft_max for layers {sorted(captured)}, expected 0..{self.model.n_layer - 1}"
            )
        layers = []
        for layer in range(self.model.n_layer):
            # each piece: (1, n_head, n_query_in_ubatch, n_kv_padded); ubatches split the queries
            rows = np.concatenate([piece[0] for piece in captured[layer]], axis=1)
            if rows.shape[1] != window or rows.shape[2] < n_keys:
                raise EngineError(f"layer {layer} attention has shape {rows.shape}, expected "
                                  f"(heads, {window}, >={n_keys})")
            layers.append(rows[:, :, :n_keys])
        probs = np.stack(layers)
        # The cache was empty, so key i is token i; causality must show it (query j sees keys <= j).
        first = n_keys - window
        if any(probs[:, :, j, first + j + 1 :].any() for j in range(window - 1)):
            raise EngineError("captured attention puts weight on future keys: cell order is not token order")
        return probs
