"""Small random-weight GGUFs that carry a model family's own chat template, for tests of what a
template decides (tool calls rendered and parsed, prompts, context limits) on the real engine.

Primitives:
- ``FamilySpec``: a family's template (``family_templates``), its control tokens, which of them
  are BOS / EOS / EOT / EOM, whether a prompt starts with BOS, and its trained context.
- ``FAMILY_SPECS``: ``qwen25`` (Hermes ``<tool_call>`` form), ``llama31``, ``mistral_v03``,
  ``gemma2``, ``phi3`` (the last two: templates without tools).
- ``write_family_gguf(family, path, seed=0, context_length=None) -> Path``: a llama-architecture
  GGUF (one layer, 32 dimensions, F32 weights drawn from ``seed``) whose "llama" (SentencePiece)
  vocabulary is the family's control tokens, the 256 byte tokens (so any text tokenizes: byte
  fallback) and the printable ASCII characters; ``tokenizer.chat_template``,
  ``llama.context_length`` and the BOS / EOS / EOT / EOM ids as the family's own files set them.
  The same arguments write the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import family_templates as templates

SPACE = "\u2581"
N_LAYERS, D_MODEL, N_HEADS, D_FF = 1, 32, 2, 64


@dataclass(frozen=True)
class FamilySpec:
    template: str
    controls: tuple[str, ...]  # the control tokens, in id order after <unk> (id 0)
    bos: str | None
    eos: str
    add_bos: bool
    context_length: int
    eot: str | None = None
    eom: str | None = None


FAMILY_SPECS: dict[str, FamilySpec] = {
    # Qwen's <|endoftext|> left out: llama.cpp would end a turn at it too, where the template closes
    # turns with <|im_end|> (a trained model writes that one; a random one may pick either)
    "qwen25": FamilySpec(templates.QWEN25, ("<|im_start|>", "<|im_end|>"), None, "<|im_end|>", False, 32768),
    "llama31": FamilySpec(templates.LLAMA31, ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                              "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"),
                          "<|begin_of_text|>", "<|eot_id|>", True, 131072, eot="<|eot_id|>", eom="<|eom_id|>"),
    "mistral_v03": FamilySpec(templates.MISTRAL_V03, ("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]",
                                                      "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
                                                      "[/TOOL_RESULTS]"), "<s>", "</s>", True, 32768),
    "gemma2": FamilySpec(templates.GEMMA2, ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"), "<bos>",
                         "<eos>", True, 8192, eot="<end_of_turn>"),
    "phi3": FamilySpec(templates.PHI3, ("<s>", "</s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>",
                                        "<|end|>"), "<s>", "<|endoftext|>", False, 4096, eot="<|end|>"),
}


def _vocab(spec: FamilySpec) -> tuple[list[str], list[float], list[int]]:
    import gguf

    tokens = ["<unk>", *spec.controls] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN] + [gguf.TokenType.CONTROL] * len(spec.controls) + [gguf.TokenType.BYTE] * 256
    chars = [SPACE if c == " " else c for c in map(chr, range(32, 127))]
    tokens += chars
    types += [gguf.TokenType.NORMAL] * len(chars)
    scores = [0.0] * (len(tokens) - len(chars)) + [-1.0] * len(chars)
    return tokens, scores, [int(t) for t in types]


def _weights(n_vocab: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def draw(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)

    out = {"token_embd.weight": draw(n_vocab, D_MODEL)}
    for i in range(N_LAYERS):
        p = f"blk.{i}."
        out[p + "attn_norm.weight"] = np.ones(D_MODEL, np.float32)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            out[p + name + ".weight"] = draw(D_MODEL, D_MODEL)
        out[p + "ffn_norm.weight"] = np.ones(D_MODEL, np.float32)
        out[p + "ffn_gate.weight"] = draw(D_FF, D_MODEL)
        out[p + "ffn_up.weight"] = draw(D_FF, D_MODEL)
        out[p + "ffn_down.weight"] = draw(D_MODEL, D_FF)
    out["output_norm.weight"] = np.ones(D_MODEL, np.float32)
    out["output.weight"] = draw(n_vocab, D_MODEL)
    return out


def write_family_gguf(family: str, path: str | Path, seed: int = 0, context_length: int | None = None) -> Path:
    import gguf

    spec = FAMILY_SPECS[family]
    tokens, scores, types = _vocab(spec)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    head_dim = D_MODEL // N_HEADS
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(f"kvres-family-{family}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(context_length or spec.context_length)
    w.add_embedding_length(D_MODEL)
    w.add_block_count(N_LAYERS)
    w.add_feed_forward_length(D_FF)
    w.add_head_count(N_HEADS)
    w.add_head_count_kv(N_HEADS)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    if spec.bos is not None:
        w.add_bos_token_id(tokens.index(spec.bos))
    w.add_eos_token_id(tokens.index(spec.eos))
    if spec.eot is not None:
        w.add_eot_token_id(tokens.index(spec.eot))
    if spec.eom is not None:
        w.add_eom_token_id(tokens.index(spec.eom))
    w.add_add_bos_token(spec.add_bos)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)
    w.add_chat_template(spec.template)
    for name, array in _weights(len(tokens), seed).items():
        w.add_tensor(name, np.ascontiguousarray(array))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)
    return path
