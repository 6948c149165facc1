"""A random-weight Llama GGUF with the chat model's vocabulary and chat template (``models.chat_vocab``):
control tokens ``<|system|>`` / ``<|user|>`` / ``<|assistant|>``, byte fallback, a Zephyr-style
``tokenizer.chat_template``. The weights speak nonsense; the tokenizer and template are real.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from models.chat_vocab import add_tokenizer, build_vocab

WORDS = ("hello", "world", "cat", "dog", "name", "is")
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF = 64, 2, 2, 1, 128


def write_chat_model(path: Path, seed: int = 0) -> Path:
    from gguf import GGUFWriter

    vocab = build_vocab(WORDS)
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        w: np.ndarray = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
        return w

    w = GGUFWriter(str(path), "llama")
    w.add_name("kvres-chat-test")
    w.add_context_length(1024)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)
    add_tokenizer(w, vocab)
    w.add_tensor("token_embd.weight", weight(len(vocab), N_EMBD))
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    w.add_tensor("output.weight", weight(len(vocab), N_EMBD))
    kv = N_EMBD // N_HEAD * N_HEAD_KV
    for i in range(N_LAYER):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", weight(N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{i}.attn_k.weight", weight(kv, N_EMBD))
        w.add_tensor(f"blk.{i}.attn_v.weight", weight(kv, N_EMBD))
        w.add_tensor(f"blk.{i}.attn_output.weight", weight(N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", weight(N_FF, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_up.weight", weight(N_FF, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_down.weight", weight(N_EMBD, N_FF))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
