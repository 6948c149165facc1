"""The chat model's vocabulary, chat template and tokenizer (llama.cpp's own SPM tokenizer; no torch).

Primitives:
- ``CHAT_TEMPLATE``: the Jinja2 template stored as ``tokenizer.chat_template`` (Zephyr style:
  ``<|role|>\\n`` + content + EOS + ``\\n``; ``add_generation_prompt`` opens an assistant turn).
  ``tools`` (as transformers and llama-server pass them) become a first system turn, one line a
  tool: ``name(param: type, ...): description`` (cut to ``DESCRIPTION_CHARS``); an assistant's
  ``tool_calls`` are written after its content as ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``
  (Hermes); a ``tool`` message is a ``<|tool|>`` turn.
- ``render(messages, add_generation_prompt=False, eos_token="</s>", tools=None) -> str``: the
  template rendered as transformers and llama-cpp-python render it (sandboxed, trim/lstrip blocks).
- ``build_vocab(words) -> Vocab``: ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, the 256 ``<0xNN>`` byte
  tokens, ``<|system|>`` ``<|user|>`` ``<|assistant|>``, ``<|tool|>`` (CONTROL), ``<tool_call>``
  ``</tool_call>`` (USER_DEFINED: detokenized as text), then SentencePiece pieces: single
  characters, and every prefix of every word, with and without the ``▁`` (space) mark.
- ``add_tokenizer(writer, vocab)``: the "llama" tokenizer block and the template into a GGUF.
- ``write_vocab_gguf(path, vocab)``: a tensor-less GGUF that llama.cpp loads with ``vocab_only``.
- ``ChatTokenizer(gguf_path)``: llama.cpp's tokenizer on that vocabulary: ``tokenize(text,
  add_bos, special)``, ``detokenize(ids)``; ``ChatTokenizer.for_vocab(vocab)`` writes the
  vocab-only GGUF to a temporary folder first.

Why every prefix: llama.cpp's SPM tokenizer only merges two adjacent symbols whose concatenation
is a piece, so a word is one token only if a chain of merges leads to it. Pieces that start with
``▁`` score above the others and ties go to the leftmost pair, so a word after a space becomes
its ``▁word`` piece and a word after a newline (the first word of every message) its bare piece.
Anything else falls back to byte tokens, so any UTF-8 text tokenizes.
"""

from __future__ import annotations

import ctypes
import functools
import os
import string
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPACE = "\u2581"
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
SPECIALS = ("<unk>", "<s>", "</s>")
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
N_BYTES = 256
SINGLE_CHARS = string.ascii_lowercase + string.ascii_uppercase + string.digits + ".,!?:;'-\"()+=/"
SCORE_SPACE, SCORE_BARE, SCORE_CHAR = -1.0, -2.0, -3.0

TOOL_ROLE, CALL_OPEN, CALL_CLOSE = "<|tool|>", "<tool_call>", "</tool_call>"
# after the role tokens: the tool role (CONTROL) and the call brackets (USER_DEFINED: llama.cpp
# detokenizes them as text, so a caller's parser sees "<tool_call>...</tool_call>")
EXTRA_TOKENS = (TOOL_ROLE, CALL_OPEN, CALL_CLOSE)
FIRST_PIECE = len(SPECIALS) + N_BYTES + len(ROLE_TOKENS) + len(EXTRA_TOKENS)
DESCRIPTION_CHARS = 48  # a tool's description is cut to this many characters in the prompt

# tools: one line each, "name(param: type, ...): description" (cut short), as a system turn first.
# An assistant turn writes its content, then each call as Hermes text; a tool result is its own turn.
CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|system|>\\ntools:\\n' }}{% for tool in tools %}"
    "{% set f = tool['function'] if tool['function'] is defined else tool %}{{ f['name'] + '(' }}"
    "{% if f['parameters'] is defined and f['parameters'] and f['parameters']['properties'] is defined %}"
    "{% for key, spec in f['parameters']['properties'].items() %}{% if not loop.first %}{{ ', ' }}{% endif %}"
    "{{ key + ': ' }}{{ spec['type'] if spec['type'] is defined else 'any' }}{% endfor %}{% endif %}{{ ')' }}"
    "{% if f['description'] is defined and f['description'] %}"
    "{{ ': ' + (f['description'] | replace('\\n', ' '))[:DESC] }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{{ eos_token + '\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '<|system|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% elif message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% elif message['role'] == 'tool' %}{{ '<|tool|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ '<|assistant|>\\n' }}"
    "{% if message['content'] %}{{ message['content'] }}{% endif %}"
    "{% if message['tool_calls'] is defined and message['tool_calls'] %}{% for call in message['tool_calls'] %}"
    "{% set fn = call['function'] if call['function'] is defined else call %}"
    "{{ '<tool_call>{\"name\": \"' + fn['name'] + '\", \"arguments\": ' }}"
    "{% if fn['arguments'] is string %}{{ fn['arguments'] }}{% else %}{{ fn['arguments'] | tojson }}{% endif %}"
    "{{ '}</tool_call>' }}{% endfor %}{% endif %}{{ eos_token + '\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
).replace("DESC", str(DESCRIPTION_CHARS))


@dataclass(frozen=True)
class Vocab:
    tokens: tuple[str, ...]
    scores: tuple[float, ...]
    types: tuple[int, ...]  # gguf.TokenType values

    def __len__(self) -> int:
        return len(self.tokens)

    def id_of(self, token: str) -> int:
        try:
            return self.tokens.index(token)
        except ValueError:
            raise KeyError(f"token {token!r} is not in the chat vocabulary") from None


def build_vocab(words: Iterable[str]) -> Vocab:
    """The vocabulary for ``words`` (lower-case ASCII); same words -> same vocabulary."""
    from gguf import TokenType

    tokens = list(SPECIALS) + [f"<0x{b:02X}>" for b in range(N_BYTES)] + list(ROLE_TOKENS)
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * N_BYTES
    types += [TokenType.CONTROL] * len(ROLE_TOKENS)
    tokens += list(EXTRA_TOKENS)
    types += [TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.USER_DEFINED]
    scores = [0.0] * len(tokens)
    seen = set(tokens)

    def add(piece: str, score: float) -> None:
        if piece not in seen:
            seen.add(piece)
            tokens.append(piece)
            types.append(TokenType.NORMAL)
            scores.append(score)

    add(SPACE, SCORE_CHAR)
    for c in SINGLE_CHARS:
        add(c, SCORE_CHAR)
    for c in string.ascii_lowercase:  # "c-a-t", "▁x": every letter after a space is one token
        add(SPACE + c, SCORE_SPACE)
    for word in sorted(set(words)):
        if not (word.isascii() and word.isalpha()):
            raise ValueError(f"word pieces must be ASCII letters, got {word!r}")
        for end in range(2, len(word) + 1):
            add(word[:end], SCORE_BARE)
        for end in range(1, len(word) + 1):
            add(SPACE + word[:end], SCORE_SPACE)
    return Vocab(tuple(tokens), tuple(scores), tuple(int(t) for t in types))


def add_tokenizer(writer: Any, vocab: Vocab) -> None:
    """The "llama" (SentencePiece) tokenizer block and the chat template."""
    writer.add_tokenizer_model("llama")
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_scores(list(vocab.scores))
    writer.add_token_types(list(vocab.types))
    writer.add_unk_token_id(UNK_ID)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(CHAT_TEMPLATE)


def write_vocab_gguf(path: str | Path, vocab: Vocab) -> Path:
    """A GGUF with the llama hyper-parameters of a 1-layer model and the tokenizer, no tensors."""
    import gguf

    path = Path(path)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("kvres-chat-vocab")
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(vocab))
    add_tokenizer(w, vocab)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@functools.lru_cache(maxsize=1)
def _template() -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(CHAT_TEMPLATE)


def render(messages: Sequence[dict[str, Any]], add_generation_prompt: bool = False, eos_token: str = "</s>",
           tools: Sequence[dict[str, Any]] | None = None) -> str:
    return str(_template().render(
        messages=list(messages), add_generation_prompt=add_generation_prompt, eos_token=eos_token,
        bos_token="<s>", tools=list(tools) if tools else None,
    ))


class ChatTokenizer:
    """llama.cpp's tokenizer of a GGUF, loaded with ``vocab_only`` (no weights)."""

    def __init__(self, gguf_path: str | Path) -> None:
        from kvres.actors.engines.llama.library import load_llama  # llama_cpp, its log routed to logging

        ll = self._ll = load_llama()
        path = Path(gguf_path)
        if not path.is_file():
            raise FileNotFoundError(f"GGUF not found: {path}")
        params = ll.llama_model_default_params()
        params.vocab_only = True
        self._model = ll.llama_model_load_from_file(os.fsencode(path), params)
        if not self._model:
            raise RuntimeError(f"llama.cpp could not load the vocabulary of {path}")
        self._vocab = ll.llama_model_get_vocab(self._model)
        self.n_vocab = int(ll.llama_vocab_n_tokens(self._vocab))

    @classmethod
    def for_vocab(cls, vocab: Vocab) -> ChatTokenizer:
        with tempfile.TemporaryDirectory(prefix="kvres-chat-vocab-") as tmp:
            return cls(write_vocab_gguf(Path(tmp) / "vocab.gguf", vocab))

    def tokenize(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        ll = self._ll
        raw = text.encode("utf-8")
        cap = len(raw) + 8
        buf = (ll.llama_token * cap)()
        n = ll.llama_tokenize(self._vocab, raw, len(raw), buf, cap, add_bos, special)
        if n < 0:
            raise RuntimeError(f"llama_tokenize failed on {len(raw)} bytes ({n})")
        return [int(t) for t in buf[:n]]

    def detokenize(self, ids: Sequence[int], render_special: bool = False) -> str:
        ll = self._ll
        arr = (ll.llama_token * max(1, len(ids)))(*[int(t) for t in ids])
        cap = 8 * len(ids) + 16
        out = ctypes.create_string_buffer(cap)
        n = ll.llama_detokenize(self._vocab, arr, len(ids), out, cap, False, render_special)
        if n < 0:
            raise RuntimeError(f"llama_detokenize failed on {len(ids)} tokens ({n})")
        return out.raw[:n].decode("utf-8", "replace")

    def piece(self, token: int) -> str:
        return str(self._ll.llama_vocab_get_text(self._vocab, int(token)).decode("utf-8", "replace"))

    def is_eog(self, token: int) -> bool:
        return bool(self._ll.llama_vocab_is_eog(self._vocab, int(token)))

    def close(self) -> None:
        if self._model:
            self._ll.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        self.close()
