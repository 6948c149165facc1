"""The attention-exposing variant of the converted graph, and the scoring pass run on it.

Primitives:
- ``with_attention_outputs(model) -> (ov.Model, output names)``: a clone whose per-layer Softmax
  (tagged ``ATTN_PROBS_TAG`` by ``graph.py``) are extra outputs ``[batch, heads, queries, keys]``.
  Raises ``CapabilityError`` when the graph has none (e.g. the SDPA form).
- ``ScoringPass(request, state_names, output_names)``: an infer request of that clone, the names of
  its KV states and of its attention outputs.
  ``attention_probs(kv, tokens, positions, window) -> probs``: replays the last ``window`` resident
  tokens over the cache before them (states set to that prefix, the same context they first saw)
  and returns their attention over every cache entry, float32 ``[layer, head, query, key]``
  (SnapKV's observation window). The session's own request is untouched.
  ``attention_after(kv, tokens, positions, window, loaded=False) -> (probs, logits, own kv)``: feeds
  ``tokens`` (not in the cache) at ``positions`` after the cache ``kv`` and returns the attention
  of their last ``window`` over the cache and themselves (how a recall scores cold blocks placed
  in ``kv`` without importing them), the last token's logits and the tokens' own KV entries.
  ``load(kv)``: set the request's states to ``kv`` (what ``attention_after(..., loaded=True)`` uses).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import openvino as ov

from kvres.policy.errors import CapabilityError

from .graph import ATTN_PROBS_TAG
from .states import KVArrays, StateNames, kv_len, take, write_kv

Probs = npt.NDArray[np.float32]


def with_attention_outputs(model: ov.Model) -> tuple[ov.Model, list[str]]:
    clone = model.clone()
    probs = [op for op in clone.get_ordered_ops()
             if op.get_type_name() == "Softmax" and op.get_friendly_name().startswith(ATTN_PROBS_TAG)]
    if not probs:
        raise CapabilityError(f"model {model.get_friendly_name()!r} has no explicit attention Softmax to expose")
    names = []
    for op in probs:
        name = op.get_friendly_name()
        op.output(0).get_tensor().add_names({name})
        names.append(name)
    clone.add_outputs([op.output(0) for op in probs])
    return clone, names


@dataclass(frozen=True)
class ScoringPass:
    request: ov.InferRequest
    state_names: StateNames
    output_names: Sequence[str]

    def load(self, kv: KVArrays) -> None:
        write_kv(self.request, self.state_names, kv)

    def _run(self, tokens: Sequence[int], positions: Sequence[int], n_keys: int, window: int) -> tuple[Any, Probs]:
        """The request's outputs for ``tokens`` at ``positions`` over ``n_keys`` keys (the states'
        entries and the tokens), and the attention of the last ``window`` tokens."""
        out = self.request.infer({
            "input_ids": np.asarray([tokens], dtype=np.int64),
            "attention_mask": np.ones((1, n_keys), dtype=np.int64),
            "position_ids": np.asarray([positions], dtype=np.int64),
            "beam_idx": np.zeros(1, dtype=np.int32),
        })
        first = len(tokens) - window
        return out, np.stack([np.asarray(out[name][0, :, first:, :], dtype=np.float32) for name in self.output_names])

    def attention_probs(self, kv: KVArrays, tokens: Sequence[int], positions: Sequence[int], window: int) -> Probs:
        n = kv_len(kv)
        if len(tokens) != n or len(positions) != n:
            raise ValueError(f"{len(tokens)} tokens / {len(positions)} positions for {n} cache entries")
        if n == 0:
            raise ValueError("no cache entries to attend to")
        w = max(1, min(window, n))
        self.load(take(kv, 0, n - w))
        _, probs = self._run(tokens[n - w:], positions[n - w:], n, w)
        self.request.reset_state()
        return probs

    def attention_after(
        self, kv: KVArrays, tokens: Sequence[int], positions: Sequence[int], window: int, loaded: bool = False,
    ) -> tuple[Probs, npt.NDArray[np.float32], KVArrays]:
        """The attention of the tokens' last ``window`` (``[layer, head, query, key]``), the last
        token's logits and the tokens' own KV entries (``loaded``: the request's states already hold
        ``kv``)."""
        n, past = len(tokens), kv_len(kv)
        if n == 0 or len(positions) != n:
            raise ValueError(f"{n} tokens with {len(positions)} positions: one each, at least one")
        w = max(1, min(window, n))
        if not loaded:
            self.load(kv)
        try:
            out, probs = self._run(tokens, positions, past + n, w)
            logits = np.array(out["logits"][0, -1], dtype=np.float32, copy=True)
            by_name = {st.name: st for st in self.request.query_state()}
            own = [(np.array(np.asarray(by_name[k].state.data)[:, :, past:], dtype=np.float32),
                    np.array(np.asarray(by_name[v].state.data)[:, :, past:], dtype=np.float32))
                   for k, v in self.state_names]
            return probs, logits, own
        finally:
            self.request.reset_state()
