"""Tiny GGUFs of several architectures llama.cpp 0.3.36 loads, written with the ``gguf`` package.

Primitives: ``ArchModel`` (one architecture's shape, tensors and metadata), ``ARCH_MODELS`` (the
ones the ground-truth tests load), ``write_arch_model(spec, path)``.

The weights are seeded noise and the vocabulary is the project's tiny SentencePiece one; the files
are a few hundred KiB. Each spec keeps its KV rows wide enough (>= 32 elements per head, so q8_0 /
q4_0 caches can be built) and its contexts long enough that llama.cpp's KV buffers are MiB-sized.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvres.actors.default_model import _vocabulary

DENSE = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
SANDWICH = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "post_attention_norm", "ffn_norm",
            "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm")
QK_NORM = ("attn_q_norm", "attn_k_norm")
MOE = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


@dataclass(frozen=True)
class ArchModel:
    arch: str
    n_layer: int
    layer_tensors: Sequence[str]
    n_embd: int = 128
    n_head: int = 4
    n_head_kv: int | Sequence[int] = 2
    head_dim: int = 32
    head_dim_swa: int | None = None  # <arch>.attention.key_length_swa / value_length_swa
    n_ff: int = 64
    window: int = 0
    pattern: int | Sequence[bool] | None = None
    tied_output: bool = False
    biases: Sequence[str] = ()
    n_expert: int = 0
    n_expert_used: int = 0
    qk_norm_width: str = "head"  # "head": one head's width; "all": every head's (olmo2)
    kv_lora_rank: int = 0  # MLA (deepseek2): one compressed KV row of kv_lora_rank + rope_dim per token
    rope_dim: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    extra_tensors: dict[str, tuple[int, ...]] = field(default_factory=dict)  # model-wide, filled with ones

    def kv_heads(self, il: int) -> int:
        return self.n_head_kv if isinstance(self.n_head_kv, int) else self.n_head_kv[il]

    def head(self, il: int) -> int:
        windowed = isinstance(self.pattern, Sequence) and bool(self.pattern[il])
        return self.head_dim_swa if windowed and self.head_dim_swa else self.head_dim


def _tensor_shape(spec: ArchModel, name: str, il: int) -> tuple[int, ...]:
    hd, kv = spec.head(il), spec.kv_heads(il)
    q, k = spec.n_head * hd, kv * hd
    shapes: dict[str, tuple[int, ...]] = {
        "attn_q": (q, spec.n_embd), "attn_k": (k, spec.n_embd), "attn_v": (k, spec.n_embd),
        "attn_output": (spec.n_embd, q), "ffn_gate": (spec.n_ff, spec.n_embd), "ffn_up": (spec.n_ff, spec.n_embd),
        "ffn_down": (spec.n_embd, spec.n_ff), "ffn_gate_inp": (spec.n_expert, spec.n_embd),
        "ffn_gate_exps": (spec.n_expert, spec.n_ff, spec.n_embd), "ffn_up_exps": (spec.n_expert, spec.n_ff, spec.n_embd),
        "ffn_down_exps": (spec.n_expert, spec.n_embd, spec.n_ff), "attn_sinks": (spec.n_head,),
        "attn_q_norm": (q if spec.qk_norm_width == "all" else hd,),
        "attn_k_norm": (k if spec.qk_norm_width == "all" else hd,),
        # MLA: queries of head_dim (nope + rope), the compressed row, its up-projections per head
        "attn_kv_a_mqa": (spec.kv_lora_rank + spec.rope_dim, spec.n_embd), "attn_kv_a_norm": (spec.kv_lora_rank,),
        "attn_k_b": (spec.n_head, spec.kv_lora_rank, hd - spec.rope_dim),
        "attn_v_b": (spec.n_head, hd, spec.kv_lora_rank),
    }
    return shapes.get(name, (spec.n_embd,))  # the rest are norms over the embedding


_BIAS = {"attn_q": "q", "attn_k": "k", "attn_v": "k", "attn_output": "e", "ffn_gate_inp": "x"}


def write_arch_model(spec: ArchModel, path: Path, seed: int = 0, chat_template: str | None = None) -> Path:
    from gguf import GGUFWriter

    tokens, scores, types = _vocabulary()
    rng = np.random.default_rng(seed)

    def noise(*shape: int) -> np.ndarray:
        w: np.ndarray = (rng.standard_normal(shape) * (0.5 / np.sqrt(shape[-1]))).astype(np.float32)
        return w

    a = spec.arch
    w = GGUFWriter(str(path), a)
    w.add_name(f"kvres-tiny-{a}")
    w.add_context_length(16384)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv if isinstance(spec.n_head_kv, int) else list(spec.n_head_kv))
    if spec.kv_lora_rank:  # llama.cpp's MLA keys: the cache row, and the per-head sizes apart
        w.add_key_length(spec.kv_lora_rank + spec.rope_dim)
        w.add_value_length(spec.kv_lora_rank)
        for key, value in (("attention.key_length_mla", spec.head_dim), ("attention.value_length_mla", spec.head_dim),
                           ("attention.kv_lora_rank", spec.kv_lora_rank), ("rope.dimension_count", spec.rope_dim),
                           ("attention.q_lora_rank", 0), ("leading_dense_block_count", spec.n_layer)):
            w.add_uint32(f"{a}.{key}", value)
    else:
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
    if spec.head_dim_swa:
        w.add_uint32(f"{a}.attention.key_length_swa", spec.head_dim_swa)
        w.add_uint32(f"{a}.attention.value_length_swa", spec.head_dim_swa)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)
    if spec.window:
        w.add_sliding_window(spec.window)
    if isinstance(spec.pattern, int):
        w.add_uint32(f"{a}.attention.sliding_window_pattern", spec.pattern)
    elif spec.pattern is not None:
        w.add_array(f"{a}.attention.sliding_window_pattern", [bool(p) for p in spec.pattern])
    if spec.n_expert:
        w.add_uint32(f"{a}.expert_count", spec.n_expert)
        w.add_uint32(f"{a}.expert_used_count", spec.n_expert_used)
        w.add_uint32(f"{a}.expert_feed_forward_length", spec.n_ff)
    for key, value in spec.meta.items():
        full = f"{a}.{key}"
        if isinstance(value, float):
            w.add_float32(full, value)
        else:
            w.add_uint32(full, int(value))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    vocab = len(tokens)
    w.add_tensor("token_embd.weight", noise(vocab, spec.n_embd))
    w.add_tensor("output_norm.weight", np.ones(spec.n_embd, dtype=np.float32))
    if not spec.tied_output:
        w.add_tensor("output.weight", noise(vocab, spec.n_embd))
    for name, shape in spec.extra_tensors.items():
        w.add_tensor(f"{name}.weight", np.ones(shape, dtype=np.float32))
    for il in range(spec.n_layer):
        for name in spec.layer_tensors:
            shape = _tensor_shape(spec, name, il)
            value = noise(*shape) if len(shape) > 1 else np.ones(shape, dtype=np.float32)
            if name == "attn_sinks":
                value = np.zeros(shape, dtype=np.float32)
            w.add_tensor(f"blk.{il}.{name}.weight", value)
        for name in spec.biases:
            if name.endswith("_exps"):
                width = spec.n_embd if name == "ffn_down_exps" else spec.n_ff
                bias = np.zeros((spec.n_expert, width), dtype=np.float32)
            else:
                width = {"q": spec.n_head * spec.head(il), "k": spec.kv_heads(il) * spec.head(il),
                         "e": spec.n_embd, "x": spec.n_expert}[_BIAS[name]]
                bias = np.zeros(width, dtype=np.float32)
            w.add_tensor(f"blk.{il}.{name}.bias", bias)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


_GEMMA3 = SANDWICH[:2] + ("attn_q_norm", "attn_k", "attn_k_norm") + SANDWICH[3:]

ARCH_MODELS: dict[str, ArchModel] = {
    "llama": ArchModel("llama", 4, DENSE),
    "deci-per-layer-kv-heads": ArchModel("deci", 4, DENSE, n_head_kv=(2, 1, 4, 2)),
    "qwen2": ArchModel("qwen2", 4, DENSE, biases=("attn_q", "attn_k", "attn_v")),
    "qwen3": ArchModel("qwen3", 4, DENSE[:2] + ("attn_q_norm", "attn_k", "attn_k_norm") + DENSE[3:]),
    "gemma2": ArchModel("gemma2", 6, SANDWICH, window=128, tied_output=True),
    "gemma3": ArchModel("gemma3", 8, _GEMMA3, window=128, tied_output=True),
    "gemma3-stride4": ArchModel("gemma3", 10, _GEMMA3, window=128, pattern=4, tied_output=True),
    "gemma3-array": ArchModel("gemma3", 6, _GEMMA3, window=256, tied_output=True,
                              pattern=(True, False, False, True, True, False)),
    "cohere2": ArchModel("cohere2", 8, ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
                                        "ffn_up", "ffn_down"),
                         window=128, tied_output=True, meta={"logit_scale": 1.0, "attention.layer_norm_epsilon": 1e-5}),
    "gpt-oss": ArchModel("gpt-oss", 4, ("attn_norm", "post_attention_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                        "attn_sinks") + MOE,
                         window=128, n_expert=4, n_expert_used=2,
                         biases=("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp", "ffn_gate_exps",
                                 "ffn_up_exps", "ffn_down_exps")),
    "gemma4-swa-heads-shared-kv": ArchModel(
        "gemma4", 8, _GEMMA3, window=128, pattern=(True, True, False, True, True, False, True, False),
        head_dim_swa=64, tied_output=True, extra_tensors={"rope_freqs": (16,)},
        meta={"embedding_length_per_layer_input": 0, "attention.shared_kv_layers": 2}),
    "deepseek2-mla": ArchModel(
        "deepseek2", 2, ("attn_norm", "attn_q", "attn_kv_a_mqa", "attn_kv_a_norm", "attn_k_b", "attn_v_b",
                         "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"),
        n_head_kv=1, head_dim=48, kv_lora_rank=96, rope_dim=32,
        meta={"expert_count": 0, "expert_used_count": 0, "expert_shared_count": 0, "expert_weights_scale": 1.0,
              "expert_feed_forward_length": 64}),
    "olmo2": ArchModel("olmo2", 8, ("attn_q", "attn_k", "attn_v", "attn_output", "post_attention_norm",
                                    "attn_q_norm", "attn_k_norm", "post_ffw_norm", "ffn_gate", "ffn_up", "ffn_down"),
                       window=128, qk_norm_width="all"),
}
