"""The openvino-genai mode: the converted model as a genai model folder, and OpenVINO's own eviction.

Primitives:
- ``export_genai_model(gguf_path, out_dir) -> Path``: a folder that ``openvino_genai.LLMPipeline``
  and ``ContinuousBatchingPipeline`` load: the IR in its ScaledDotProductAttention form (what the
  paged-attention transformation of continuous batching needs), ``openvino_tokenizer.xml`` /
  ``openvino_detokenizer.xml`` built from the GGUF vocabulary, ``config.json`` and
  ``generation_config.json`` (bos / eos ids).
- ``EngineEviction(start_size, recent_size, max_cache_size, aggregation="NORM_SUM",
  snapkv_window_size=8)``: "let the engine evict", a kvres-side description of genai's
  ``CacheEvictionConfig``; ``from_stream_policy(policy, budget)`` maps a StreamingLLM policy and a
  token budget onto it (sizes rounded up to whole KV blocks, as genai requires); ``to_genai()``.
- ``GenAIEngine(model_dir, eviction=None, f32=True, num_threads=1, num_kv_blocks=KV_BLOCKS)``: a
  continuous-batching pipeline over a KV pool of ``num_kv_blocks`` blocks of ``KV_BLOCK`` cells;
  ``generate(prompts, max_new_tokens) -> list[list[int]]`` (greedy, token ids in and out).

KV here is not range-addressable from Python: eviction is genai's (SUM / NORM_SUM aggregation of
attention inside its paged attention); kvres's own mechanisms live in ``executor.py``. genai
evicts only as it generates, never inside a prompt: a prompt longer than the pool comes back with
no tokens, and a generation that fills it ends short, both without an error (measured on
stories260K), so the callers keep within the pool.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov

from kvres.policy.planner import StreamPolicy

from .genai_tokenizer import build_tokenizer_models
from .gguf_weights import read_llama_gguf
from .graph import build_llama_model
from .model import IR_FILE

KV_BLOCK = 32  # genai's CPU KV block size: eviction sizes are whole blocks
KV_BLOCKS = 256  # a pipeline's KV pool, in blocks: one request's prompt and its tokens must fit it
AGGREGATIONS = ("SUM", "NORM_SUM")


def export_genai_model(gguf_path: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> Path:
    weights = read_llama_gguf(gguf_path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ov.save_model(build_llama_model(weights, attention="sdpa"), str(out / IR_FILE), compress_to_fp16=False)
    tokenizer, detokenizer = build_tokenizer_models(weights.tokenizer)
    ov.save_model(tokenizer, str(out / "openvino_tokenizer.xml"))
    ov.save_model(detokenizer, str(out / "openvino_detokenizer.xml"))
    cfg = weights.config
    ids = {k: int(weights.tokenizer[k]) for k in ("bos_token_id", "eos_token_id") if k in weights.tokenizer}
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": cfg.n_embd,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "intermediate_size": cfg.n_ff, "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_eps, "rope_theta": cfg.rope_freq_base,
        "max_position_embeddings": cfg.context_length, "kvres_model_id": weights.model_id, **ids,
    }, indent=2))
    (out / "generation_config.json").write_text(json.dumps(ids, indent=2))
    return out


def _blocks(n: int) -> int:
    return max(KV_BLOCK, -(-n // KV_BLOCK) * KV_BLOCK)


@dataclass(frozen=True)
class EngineEviction:
    start_size: int
    recent_size: int
    max_cache_size: int
    aggregation: str = "NORM_SUM"
    snapkv_window_size: int = 8

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        for name in ("start_size", "recent_size", "max_cache_size"):
            value = getattr(self, name)
            if value <= 0 or value % KV_BLOCK:
                raise ValueError(f"EngineEviction.{name} must be a positive multiple of {KV_BLOCK}, got {value}")
        if self.max_cache_size <= self.start_size + self.recent_size:
            raise ValueError(
                f"EngineEviction.max_cache_size {self.max_cache_size} must exceed start_size + recent_size "
                f"({self.start_size + self.recent_size})"
            )

    @classmethod
    def from_stream_policy(cls, policy: StreamPolicy, budget_tokens: int, aggregation: str = "NORM_SUM") -> EngineEviction:
        start, recent = _blocks(policy.sink_tokens), _blocks(policy.recent_tokens)
        return cls(start, recent, max(_blocks(budget_tokens), start + recent + KV_BLOCK), aggregation)

    def to_genai(self) -> Any:
        import openvino_genai as genai

        return genai.CacheEvictionConfig(
            start_size=self.start_size, recent_size=self.recent_size, max_cache_size=self.max_cache_size,
            aggregation_mode=getattr(genai.AggregationMode, self.aggregation),
            snapkv_window_size=self.snapkv_window_size,
        )


class GenAIEngine:
    def __init__(self, model_dir: str | os.PathLike[str], eviction: EngineEviction | None = None,
                 f32: bool = True, num_threads: int = 1, num_kv_blocks: int = KV_BLOCKS) -> None:
        import openvino_genai as genai

        self._genai = genai
        self.model_dir = Path(model_dir)
        sched = genai.SchedulerConfig()
        sched.num_kv_blocks = num_kv_blocks
        sched.max_num_batched_tokens = 4096
        sched.dynamic_split_fuse = True
        if eviction is not None:
            sched.use_cache_eviction = True
            sched.cache_eviction_config = eviction.to_genai()
        props: dict[str, Any] = {"INFERENCE_NUM_THREADS": num_threads}
        if f32:
            props |= {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
        self.eviction = eviction
        self.pipeline = genai.ContinuousBatchingPipeline(str(self.model_dir), sched, "CPU", props)
        gen = json.loads((self.model_dir / "generation_config.json").read_text())
        self.eos_token_id = int(gen.get("eos_token_id", 2))

    def _config(self, max_new_tokens: int) -> Any:
        cfg = self._genai.GenerationConfig()
        cfg.max_new_tokens = max_new_tokens
        cfg.do_sample = False
        cfg.set_eos_token_id(self.eos_token_id)
        return cfg

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
        tensors = [ov.Tensor(np.asarray([list(p)], dtype=np.int64)) for p in prompts]
        results = self.pipeline.generate(tensors, [self._config(max_new_tokens)] * len(tensors))
        return [list(r.m_generation_ids[0]) for r in results]

