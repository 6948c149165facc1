"""The attention-exposing variant of the converted graph, and the scoring pass run on it.

Primitives:
- ``with_attention_outputs(model) -> (ov.Model, output names)``: a clone whose per-layer Softmax
  (tagged ``ATTN_PROBS_TAG`` by ``graph.py``) are extra outputs ``[batch, heads, queries, keys]``.
  Raises ``CapabilityError`` when the graph has none (e.g. the SDPA form).
- ``attention_probs(request, names, output_names, kv, tokens, positions, window) -> probs``:
  replays the last ``window`` resident tokens over the cache before them (states set to that
  prefix, the same context they first saw) and returns their attention over every cache entry,
  float32 ``[layer, head, query, key]`` (SnapKV's observation window). The session's own request
  is untouched.
- ``attention_after(request, names, output_names, kv, tokens, positions, window) -> probs``: feeds
  ``tokens`` (not in the cache) at ``positions`` after the cache ``kv`` and returns the attention
  of their last ``window`` over the cache and themselves (how a recall scores cold blocks placed
  in ``kv`` without importing them), the last token's logits and the tokens' own KV entries.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import openvino as ov

from kvres.policy.errors import CapabilityError

from .graph import ATTN_PROBS_TAG
from .states import KVArrays, StateNames, kv_len, take, write_kv


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


def attention_probs(
    request: ov.InferRequest,
    state_names: StateNames,
    output_names: Sequence[str],
    kv: KVArrays,
    tokens: Sequence[int],
    positions: Sequence[int],
    window: int,
) -> npt.NDArray[np.float32]:
    n = kv_len(kv)
    if len(tokens) != n or len(positions) != n:
        raise ValueError(f"{len(tokens)} tokens / {len(positions)} positions for {n} cache entries")
    if n == 0:
        raise ValueError("no cache entries to attend to")
    w = max(1, min(window, n))
    write_kv(request, state_names, take(kv, 0, n - w))
    out = request.infer({
        "input_ids": np.asarray([tokens[n - w:]], dtype=np.int64),
        "attention_mask": np.ones((1, n), dtype=np.int64),
        "position_ids": np.asarray([positions[n - w:]], dtype=np.int64),
        "beam_idx": np.zeros(1, dtype=np.int32),
    })
    probs = np.stack([np.asarray(out[name][0], dtype=np.float32) for name in output_names])
    request.reset_state()
    return probs


def attention_after(
    request: ov.InferRequest,
    state_names: StateNames,
    output_names: Sequence[str],
    kv: KVArrays,
    tokens: Sequence[int],
    positions: Sequence[int],
    window: int,
    loaded: bool = False,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], KVArrays]:
    """The attention of the tokens' last ``window`` (``[layer, head, query, key]``), the last
    token's logits and the tokens' own KV entries (``loaded``: the request's states already hold
    ``kv``)."""
    n, past = len(tokens), kv_len(kv)
    if n == 0 or len(positions) != n:
        raise ValueError(f"{n} tokens with {len(positions)} positions: one each, at least one")
    w = max(1, min(window, n))
    if not loaded:
        write_kv(request, state_names, kv)
    try:
        out = request.infer({
            "input_ids": np.asarray([tokens], dtype=np.int64),
            "attention_mask": np.ones((1, past + n), dtype=np.int64),
            "position_ids": np.asarray([positions], dtype=np.int64),
            "beam_idx": np.zeros(1, dtype=np.int32),
        })
        probs = np.stack([np.asarray(out[name][0, :, n - w :, :], dtype=np.float32) for name in output_names])
        logits = np.array(out["logits"][0, -1], dtype=np.float32, copy=True)
        by_name = {st.name: st for st in request.query_state()}
        own = [(np.array(np.asarray(by_name[k].state.data)[:, :, past:], dtype=np.float32),
                np.array(np.asarray(by_name[v].state.data)[:, :, past:], dtype=np.float32)) for k, v in state_names]
        return probs, logits, own
    finally:
        request.reset_state()
