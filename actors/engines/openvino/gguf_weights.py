"""Read a Llama GGUF file into a config and float32 numpy weights, for building an OpenVINO IR.

Primitives:
- ``LlamaConfig``: the hyper-parameters the graph needs (and that re-basing keys needs: RoPE base).
- ``LlamaWeights``: ``config`` + ``tensors`` (name -> float32 array in (n_out, n_in) layout) +
  ``model_id`` (``kvres.actors.model_files.model_id`` of the file) + ``tokenizer`` metadata.
- ``read_llama_gguf(path) -> LlamaWeights``; raises ``ModelLoadError`` naming the path for a file
  that is missing, not a GGUF, or not a Llama model this converter understands.

Pitfalls handled here (see docs/architecture.md, OpenVINO): ``GGUFReader`` tensor ``shape`` is in
ggml ``ne`` order (``[n_in, n_out]``) while ``data`` is already shaped ``(n_out, n_in)``, so ``data``
is used as is; quantized tensors are raw bytes and go through ``gguf.quants.dequantize``; no
``rope.freq_base`` key means 10000; an absent ``output.weight`` means the output matrix is tied to
``token_embd``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kvres.actors.model_files import gguf_value, model_id, open_gguf
from kvres.policy.errors import ModelLoadError

F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class LlamaConfig:
    n_layers: int
    n_embd: int
    n_heads: int
    n_kv_heads: int
    n_ff: int
    vocab_size: int
    rms_eps: float
    rope_freq_base: float
    rope_dims: int
    context_length: int

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_heads


@dataclass
class LlamaWeights:
    config: LlamaConfig
    tensors: dict[str, F32]
    model_id: str
    tokenizer: dict[str, Any] = field(default_factory=dict)


def _tensor_f32(t: Any) -> F32:
    import gguf

    if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16,
                         gguf.GGMLQuantizationType.BF16):
        if t.tensor_type == gguf.GGMLQuantizationType.BF16:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
        else:
            arr = np.asarray(t.data)
    else:
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
    # ggml ne order is reversed numpy order: shape (n_out, n_in) for a 2-D weight
    expected = tuple(int(d) for d in reversed(t.shape.tolist()))
    return np.ascontiguousarray(np.asarray(arr, dtype=np.float32).reshape(expected))


def read_llama_gguf(path: str | os.PathLike[str]) -> LlamaWeights:
    p = Path(path)
    reader = open_gguf(p)
    arch = gguf_value(reader, "general.architecture")
    if arch != "llama":
        raise ModelLoadError(
            f"GGUF file {str(p)!r} has architecture {arch!r}; this converter handles 'llama' only"
        )
    try:
        n_embd = int(gguf_value(reader, "llama.embedding_length"))
        n_heads = int(gguf_value(reader, "llama.attention.head_count"))
        cfg = LlamaConfig(
            n_layers=int(gguf_value(reader, "llama.block_count")),
            n_embd=n_embd,
            n_heads=n_heads,
            n_kv_heads=int(gguf_value(reader, "llama.attention.head_count_kv", n_heads)),
            n_ff=int(gguf_value(reader, "llama.feed_forward_length")),
            vocab_size=0,
            rms_eps=float(gguf_value(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
            rope_freq_base=float(gguf_value(reader, "llama.rope.freq_base", 10000.0)),
            rope_dims=int(gguf_value(reader, "llama.rope.dimension_count", n_embd // n_heads)),
            context_length=int(gguf_value(reader, "llama.context_length", 2048)),
        )
    except TypeError as exc:
        raise ModelLoadError(f"GGUF file {str(p)!r} lacks a llama hyper-parameter: {exc}") from exc
    scaling = gguf_value(reader, "llama.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ModelLoadError(f"GGUF file {str(p)!r} uses RoPE scaling {scaling!r}, not supported")
    if cfg.rope_dims != cfg.head_dim:
        raise ModelLoadError(
            f"GGUF file {str(p)!r}: partial RoPE ({cfg.rope_dims} of head_dim {cfg.head_dim}) not supported"
        )
    tensors = {t.name: _tensor_f32(t) for t in reader.tensors}
    if "output.weight" not in tensors and "token_embd.weight" in tensors:
        tensors["output.weight"] = tensors["token_embd.weight"]
    needed = ["token_embd.weight", "output_norm.weight"] + [
        f"blk.{i}.{n}.weight"
        for i in range(cfg.n_layers)
        for n in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                  "ffn_gate", "ffn_up", "ffn_down")
    ]
    missing = [n for n in needed if n not in tensors]
    if missing:
        raise ModelLoadError(f"GGUF file {str(p)!r} lacks tensor {missing[0]!r} ({len(missing)} missing)")
    vocab = int(tensors["token_embd.weight"].shape[0])
    cfg = LlamaConfig(**{**cfg.__dict__, "vocab_size": vocab})
    tokenizer = {
        key.removeprefix("tokenizer.ggml."): gguf_value(reader, key)
        for key in reader.fields
        if key.startswith("tokenizer.ggml.")
    }
    return LlamaWeights(cfg, tensors, model_id=model_id(p), tokenizer=tokenizer)
