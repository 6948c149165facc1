"""Build a stateful OpenVINO LLM graph for a Llama model with the opset Python API (no torch).

Primitives:
- ``build_llama_model(weights, attention="explicit"|"sdpa") -> ov.Model``: inputs ``input_ids``,
  ``attention_mask``, ``position_ids`` (all i64) and ``beam_idx`` (i32); output ``logits``
  ``[batch, tokens, vocab]``; one ReadValue/Assign variable per layer for keys and for values,
  named ``past_key_values.<layer>.keypresent.<layer>.key`` / ``...valuepresent.<layer>.value``,
  holding ``[batch, kv_heads, seq, head_dim]`` (keys after RoPE).
- ``KV_STATE_PATTERN``: the regex that maps a state name to (layer, "key"|"value").
- ``ATTN_PROBS_TAG``: the friendly-name prefix of each layer's Softmax (explicit attention only),
  which the scoring pass turns into outputs.

The graph: RMSNorm (the file's eps), llama.cpp NORM-style RoPE (adjacent pairs x[2i], x[2i+1]),
grouped-query attention (query head h reads kv head h // (n_heads / n_kv_heads)), an explicit
causal mask (key j is visible to new token i iff j <= past + i and attention_mask[j] == 1), SwiGLU
feed-forward, tied or separate output matrix. ``attention="sdpa"`` uses the
ScaledDotProductAttention op with the same explicit mask instead of MatMul/Softmax, the form
OpenVINO's paged-attention transformation (openvino-genai's continuous batching) recognises.
Model metadata needed later (RoPE base, geometry, model id) is stored in rt_info under ``kvres``.
"""

from __future__ import annotations

import re

import numpy as np
import openvino as ov
import openvino.opset13 as ops
from openvino.op.util import Variable, VariableInfo

from .gguf_weights import LlamaConfig, LlamaWeights

KV_STATE_PATTERN = re.compile(r"past_key_values\.(\d+)\.(key|value)")
ATTN_PROBS_TAG = "kvres_attn_probs"
RT_INFO_ROOT = "kvres"


def _const(arr: np.ndarray | float | int | list[int], dtype: type = np.float32) -> ov.Node:
    return ops.constant(np.asarray(arr, dtype=dtype))


def _i64(values: list[int] | int) -> ov.Node:
    return ops.constant(np.asarray(values, dtype=np.int64))


def _rms_norm(x: ov.Output, weight: np.ndarray, eps: float) -> ov.Node:
    sq = ops.multiply(x, x)
    mean = ops.reduce_mean(sq, _i64([-1]), keep_dims=True)
    inv = ops.sqrt(ops.add(mean, _const(eps)))
    return ops.multiply(ops.divide(x, inv), _const(weight))


def _linear(x: ov.Output, weight: np.ndarray, name: str) -> ov.Node:
    """x @ weight.T for weight of shape (n_out, n_in)."""
    return ops.matmul(x, _const(weight), transpose_a=False, transpose_b=True, name=name)


def _rope_norm(x: ov.Output, cos: ov.Output, sin: ov.Output, head_dim: int) -> ov.Node:
    """llama.cpp NORM RoPE on x [B, H, T, D]: rotate adjacent pairs (x[2i], x[2i+1])."""
    pairs = ops.reshape(x, _i64([0, 0, 0, head_dim // 2, 2]), special_zero=True)
    x0 = ops.gather(pairs, _i64(0), _i64(4))
    x1 = ops.gather(pairs, _i64(1), _i64(4))
    out0 = ops.subtract(ops.multiply(x0, cos), ops.multiply(x1, sin))
    out1 = ops.add(ops.multiply(x0, sin), ops.multiply(x1, cos))
    stacked = ops.concat([ops.unsqueeze(out0, _i64([4])), ops.unsqueeze(out1, _i64([4]))], 4)
    return ops.reshape(stacked, _i64([0, 0, 0, head_dim]), special_zero=True)


def _kv_state(
    name: str, new: ov.Output, batch: ov.Output, beam_idx: ov.Output, cfg: LlamaConfig
) -> tuple[ov.Node, ov.Node]:
    """Read the cached [B, KVH, S, D] for ``name``, append ``new``, assign it back."""
    info = VariableInfo()
    info.variable_id = name
    info.data_type = ov.Type.f32
    info.data_shape = ov.PartialShape([-1, cfg.n_kv_heads, -1, cfg.head_dim])
    var = Variable(info)
    init_shape = ops.concat([batch, _i64([cfg.n_kv_heads, 0, cfg.head_dim])], 0)
    init = ops.broadcast(_const(0.0), init_shape)
    past = ops.read_value(init, var)
    past = ops.gather(past, beam_idx, _i64(0))
    present = ops.concat([past, new], 2)
    assign = ov.op.assign(present, var)
    return present, assign


def _repeat_kv(x: ov.Output, cfg: LlamaConfig) -> ov.Output:
    rep = cfg.n_heads // cfg.n_kv_heads
    if rep == 1:
        return x
    shape = ops.shape_of(x)  # [B, KVH, S, D]
    b = ops.gather(shape, _i64([0]), _i64(0))
    s = ops.gather(shape, _i64([2]), _i64(0))
    x5 = ops.unsqueeze(x, _i64([2]))  # [B, KVH, 1, S, D]
    target = ops.concat([b, _i64([cfg.n_kv_heads, rep]), s, _i64([cfg.head_dim])], 0)
    x5 = ops.broadcast(x5, target)
    return ops.reshape(x5, _i64([0, cfg.n_heads, -1, cfg.head_dim]), special_zero=True)


def build_llama_model(weights: LlamaWeights, attention: str = "explicit") -> ov.Model:
    if attention not in ("explicit", "sdpa"):
        raise ValueError(f"attention must be 'explicit' or 'sdpa', got {attention!r}")
    cfg = weights.config
    w = weights.tensors
    hd = cfg.head_dim

    input_ids = ops.parameter([-1, -1], ov.Type.i64, name="input_ids")
    attention_mask = ops.parameter([-1, -1], ov.Type.i64, name="attention_mask")
    position_ids = ops.parameter([-1, -1], ov.Type.i64, name="position_ids")
    beam_idx = ops.parameter([-1], ov.Type.i32, name="beam_idx")
    for p in (input_ids, attention_mask, position_ids, beam_idx):
        p.output(0).get_tensor().set_names({p.get_friendly_name()})

    ids_shape = ops.shape_of(input_ids)
    batch = ops.gather(ids_shape, _i64([0]), _i64(0))
    n_new = ops.gather(ids_shape, _i64([1]), _i64(0))

    # RoPE tables from position_ids: theta_i = pos * base^(-2i/D), shape [B, 1, T, D/2]
    inv_freq = 1.0 / (cfg.rope_freq_base ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    pos_f = ops.convert(ops.unsqueeze(position_ids, _i64([1, 3])), ov.Type.f32)  # [B,1,T,1]
    angles = ops.multiply(pos_f, _const(inv_freq.astype(np.float32).reshape(1, 1, 1, -1)))
    cos, sin = ops.cos(angles), ops.sin(angles)

    # causal + padding mask [B, 1, T, S] as a boolean "visible"
    mask_shape = ops.shape_of(attention_mask)
    total = ops.gather(mask_shape, _i64(1), _i64(0))
    past_len = ops.subtract(total, ops.squeeze(n_new, _i64([0])))
    key_idx = ops.range(_i64(0), total, _i64(1), ov.Type.i64)  # [S]
    q_idx = ops.add(ops.range(_i64(0), ops.squeeze(n_new, _i64([0])), _i64(1), ov.Type.i64), past_len)
    causal = ops.less_equal(ops.unsqueeze(key_idx, _i64([0])), ops.unsqueeze(q_idx, _i64([1])))  # [T,S]
    padded = ops.unsqueeze(ops.equal(attention_mask, _i64(1)), _i64([1, 2]))  # [B,1,1,S]
    visible = ops.logical_and(ops.unsqueeze(causal, _i64([0, 1])), padded)  # [B,1,T,S]
    float_mask = ops.select(visible, _const(0.0), _const(-np.inf))

    x = ops.gather(_const(w["token_embd.weight"]), input_ids, _i64(0))  # [B, T, E]
    sinks = []
    scale = 1.0 / np.sqrt(hd)
    for i in range(cfg.n_layers):
        pre = f"blk.{i}."
        h = _rms_norm(x, w[pre + "attn_norm.weight"], cfg.rms_eps)

        def heads(t: ov.Output, n: int) -> ov.Node:
            t = ops.reshape(t, _i64([0, 0, n, hd]), special_zero=True)
            return ops.transpose(t, _i64([0, 2, 1, 3]))  # [B, n, T, D]

        q = heads(_linear(h, w[pre + "attn_q.weight"], f"{pre}q"), cfg.n_heads)
        k = heads(_linear(h, w[pre + "attn_k.weight"], f"{pre}k"), cfg.n_kv_heads)
        v = heads(_linear(h, w[pre + "attn_v.weight"], f"{pre}v"), cfg.n_kv_heads)
        q = _rope_norm(q, cos, sin, hd)
        k = _rope_norm(k, cos, sin, hd)
        k_all, k_assign = _kv_state(f"past_key_values.{i}.keypresent.{i}.key", k, batch, beam_idx, cfg)
        v_all, v_assign = _kv_state(f"past_key_values.{i}.valuepresent.{i}.value", v, batch, beam_idx, cfg)
        sinks += [k_assign, v_assign]
        k_rep, v_rep = _repeat_kv(k_all, cfg), _repeat_kv(v_all, cfg)
        if attention == "sdpa":
            ctx = ops.scaled_dot_product_attention(
                q, k_rep, v_rep, float_mask, _const(scale), causal=False
            )
        else:
            logits = ops.matmul(q, k_rep, transpose_a=False, transpose_b=True)
            logits = ops.add(ops.multiply(logits, _const(scale)), float_mask)
            probs = ops.softmax(logits, -1, name=f"{ATTN_PROBS_TAG}.{i}")
            ctx = ops.matmul(probs, v_rep, transpose_a=False, transpose_b=False)
        ctx = ops.reshape(ops.transpose(ctx, _i64([0, 2, 1, 3])), _i64([0, 0, cfg.n_embd]), special_zero=True)
        x = ops.add(x, _linear(ctx, w[pre + "attn_output.weight"], f"{pre}o"))
        h = _rms_norm(x, w[pre + "ffn_norm.weight"], cfg.rms_eps)
        gate = ops.swish(_linear(h, w[pre + "ffn_gate.weight"], f"{pre}gate"))
        up = _linear(h, w[pre + "ffn_up.weight"], f"{pre}up")
        x = ops.add(x, _linear(ops.multiply(gate, up), w[pre + "ffn_down.weight"], f"{pre}down"))

    x = _rms_norm(x, w["output_norm.weight"], cfg.rms_eps)
    logits = _linear(x, w["output.weight"], "lm_head")
    result = ops.result(logits, name="logits")
    result.output(0).get_tensor().set_names({"logits"})
    logits.output(0).get_tensor().set_names({"logits"})
    model = ov.Model([result], sinks, [input_ids, attention_mask, position_ids, beam_idx], "kvres_llama")
    _store_rt_info(model, weights, attention)
    return model


def _store_rt_info(model: ov.Model, weights: LlamaWeights, attention: str) -> None:
    cfg = weights.config
    values = {
        "model_id": weights.model_id,
        "attention": attention,
        "rope_style": "norm",
        "rope_freq_base": repr(cfg.rope_freq_base),
        "rms_eps": repr(cfg.rms_eps),
        "n_layers": str(cfg.n_layers),
        "n_heads": str(cfg.n_heads),
        "n_kv_heads": str(cfg.n_kv_heads),
        "head_dim": str(cfg.head_dim),
        "vocab_size": str(cfg.vocab_size),
        "context_length": str(cfg.context_length),
    }
    for key, value in values.items():
        model.set_rt_info(value, [RT_INFO_ROOT, key])
