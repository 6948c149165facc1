"""Read a Llama GGUF file into a config and float32 numpy weights, for building an OpenVINO IR.

Primitives:
- ``LlamaConfig``: the hyper-parameters the graph needs (and that re-basing keys needs: RoPE base).
- ``LlamaWeights``: ``config`` + ``tensors`` (name -> float32 array in (n_out, n_in) layout) +
  ``model_id`` (a content hash of the file) + ``tokenizer`` metadata.
- ``read_llama_gguf(path) -> LlamaWeights``; raises ``ModelLoadError`` naming the path for a file
  that is missing, not a GGUF, or not a Llama model this converter understands.

Pitfalls handled here (see DESIGN 5.2): ``GGUFReader`` tensor ``shape`` is in ggml ``ne`` order
(``[n_in, n_out]``) while ``data`` is already shaped ``(n_out, n_in)``, so ``data`` is used as is;
quantized tensors are raw bytes and go through ``gguf.quants.dequantize``; no ``rope.freq_base`` key
means 10000; an absent ``output.weight`` means the output matrix is tied to ``token_embd``.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kvres.policy.errors import ModelLoadError

F32 = npt.NDArray[np.float32]
GGUF_MAGIC = b"GGUF"


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


def file_digest(path: Path, n_hex: int = 16) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:n_hex]


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return default
    value = f.contents()
    return value


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
    if not p.is_file():
        raise ModelLoadError(f"GGUF model file {str(p)!r} does not exist")
    with p.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"{str(p)!r} is not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
    import gguf

    try:
        reader = gguf.GGUFReader(str(p))
    except Exception as exc:  # the reader raises assorted errors on damaged files
        raise ModelLoadError(f"cannot read GGUF file {str(p)!r}: {exc}") from exc
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ModelLoadError(
            f"GGUF file {str(p)!r} has architecture {arch!r}; this converter handles 'llama' only"
        )
    try:
        n_embd = int(_field(reader, "llama.embedding_length"))
        n_heads = int(_field(reader, "llama.attention.head_count"))
        cfg = LlamaConfig(
            n_layers=int(_field(reader, "llama.block_count")),
            n_embd=n_embd,
            n_heads=n_heads,
            n_kv_heads=int(_field(reader, "llama.attention.head_count_kv", n_heads)),
            n_ff=int(_field(reader, "llama.feed_forward_length")),
            vocab_size=0,
            rms_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
            rope_freq_base=float(_field(reader, "llama.rope.freq_base", 10000.0)),
            rope_dims=int(_field(reader, "llama.rope.dimension_count", n_embd // n_heads)),
            context_length=int(_field(reader, "llama.context_length", 2048)),
        )
    except TypeError as exc:
        raise ModelLoadError(f"GGUF file {str(p)!r} lacks a llama hyper-parameter: {exc}") from exc
    scaling = _field(reader, "llama.rope.scaling.type")
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
        key.removeprefix("tokenizer.ggml."): _field(reader, key)
        for key in reader.fields
        if key.startswith("tokenizer.ggml.")
    }
    return LlamaWeights(cfg, tensors, model_id=f"gguf-{file_digest(p)}", tokenizer=tokenizer)
