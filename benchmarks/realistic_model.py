"""A random-weight llama GGUF of a realistic shape, for benchmarks whose costs depend on the shape.

Primitives:
- ``ModelShape(n_layer=12, n_embd=768, n_head=12, n_head_kv=4, n_ff=2048, n_vocab=32000,
  context_length=8192)``: a llama with grouped-query attention (``n_head / n_head_kv`` query heads
  share a KV head); ``REALISTIC`` is the default, about the size of a 125M-parameter model, its
  KV 12 KiB per token at f16. ``head_dim``, ``kv_bytes_per_token(bytes_per_value=2)``,
  ``n_params``.
- ``write_realistic_model(path, shape=REALISTIC, seed=0, chat_template=None) -> Path``: writes it
  with the ``gguf`` package: f16 matrices of seeded noise (scaled by 1 / sqrt(fan-in)), f32 norms,
  and a SentencePiece vocabulary of ``n_vocab`` tokens (the 3 control tokens, 256 byte tokens, then
  made-up word pieces), so llama.cpp tokenizes text and decodes any token id; ``chat_template``
  (Jinja2 text, e.g. ``CHAT_TEMPLATE``) goes into ``tokenizer.chat_template``, so the model can be
  served through the chat API. Written to a temporary name and renamed, so a reader never sees
  half a file.
- ``CHAT_TEMPLATE``: a Zephyr-style template (``<|role|>`` headers, each message closed by EOS).

The weights are noise: what comes out is not language, but every decode reads the same bytes and
does the same arithmetic as a trained model of this shape.
"""

from __future__ import annotations

import itertools
import os
import string
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class ModelShape:
    n_layer: int = 12
    n_embd: int = 768
    n_head: int = 12
    n_head_kv: int = 4
    n_ff: int = 2048
    n_vocab: int = 32000
    context_length: int = 8192

    def __post_init__(self) -> None:
        if min(self.n_layer, self.n_embd, self.n_head, self.n_head_kv, self.n_ff) < 1:
            raise ValueError(f"every size of a model shape must be >= 1: {self}")
        if self.n_embd % self.n_head or self.n_head % self.n_head_kv:
            raise ValueError(f"n_embd must divide by n_head and n_head by n_head_kv: {self}")
        if self.n_vocab < 3 + 256 + 1:
            raise ValueError(f"n_vocab must be > 259 (3 control tokens, 256 bytes), got {self.n_vocab}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        return 2 * self.n_layer * self.n_head_kv * self.head_dim * bytes_per_value

    @property
    def n_params(self) -> int:
        kv = self.n_head_kv * self.head_dim
        layer = 2 * self.n_embd * self.n_embd + 2 * self.n_embd * kv + 3 * self.n_embd * self.n_ff
        return self.n_layer * layer + 2 * self.n_vocab * self.n_embd


REALISTIC = ModelShape()
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _vocabulary(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    from gguf import TokenType

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    letters = string.ascii_lowercase
    words = ("".join(p) for n in itertools.count(1) for p in itertools.product(letters, repeat=n))
    pieces = ["▁"] + [f"▁{w}" for w in itertools.islice(words, n_vocab - len(tokens) - 1)]
    scores = [0.0] * len(tokens) + [-float(i) for i in range(len(pieces))]
    return tokens + pieces, scores, [int(t) for t in types] + [int(TokenType.NORMAL)] * len(pieces)


def write_realistic_model(path: str | os.PathLike[str], shape: ModelShape = REALISTIC, seed: int = 0,
                          chat_template: str | None = None) -> Path:
    from gguf import GGUFWriter

    path = Path(path)
    tokens, scores, types = _vocabulary(shape.n_vocab)
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int) -> np.ndarray:
        w: np.ndarray = rng.standard_normal((rows, cols), dtype=np.float32)
        w *= 1.0 / np.sqrt(cols)
        return w.astype(np.float16)

    def norm() -> np.ndarray:
        return np.ones(shape.n_embd, dtype=np.float32)

    kv = shape.n_head_kv * shape.head_dim
    tmp = path.with_name(path.name + ".tmp")
    w = GGUFWriter(str(tmp), "llama")
    w.add_name(f"kvres-realistic-{shape.n_layer}x{shape.n_embd}")
    w.add_context_length(shape.context_length)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(1)  # mostly f16
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.add_tensor("token_embd.weight", matrix(shape.n_vocab, shape.n_embd))
    w.add_tensor("output_norm.weight", norm())
    w.add_tensor("output.weight", matrix(shape.n_vocab, shape.n_embd))
    for il in range(shape.n_layer):
        for name, (rows, cols) in (("attn_q", (shape.n_embd, shape.n_embd)), ("attn_k", (kv, shape.n_embd)),
                                   ("attn_v", (kv, shape.n_embd)), ("attn_output", (shape.n_embd, shape.n_embd)),
                                   ("ffn_gate", (shape.n_ff, shape.n_embd)), ("ffn_up", (shape.n_ff, shape.n_embd)),
                                   ("ffn_down", (shape.n_embd, shape.n_ff))):
            w.add_tensor(f"blk.{il}.{name}.weight", matrix(rows, cols))
        w.add_tensor(f"blk.{il}.attn_norm.weight", norm())
        w.add_tensor(f"blk.{il}.ffn_norm.weight", norm())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)
    return path
