"""The chat model in llama.cpp: greedy replies that stop at EOS, and their accuracy (no torch).

Primitives:
- ``LlamaChat(gguf_path, n_ctx=512, n_threads=2)``: one model + context (f32 KV, full cache) that
  keeps one conversation's tokens in its KV cache. ``reply(messages, max_tokens=32)`` renders the
  messages with the chat template (``add_generation_prompt``), tokenizes them with the model's own
  tokenizer (special tokens parsed), prefills only what the cache does not hold yet (dropping any
  tail that differs), then decodes greedily until EOS or ``max_tokens``. It returns a ``Reply``.
- ``Reply``: the generated ids (EOS excluded), their text, whether EOS ended them, and how many
  prompt tokens were prefilled for it.
- ``chat_accuracy(gguf_path, conversations, own_history=False) -> ChatScore``: every assistant
  turn of every conversation, in order; ``exact`` is the share of replies equal to the reference,
  ``eos`` the share that ended with EOS within ``max_tokens``; per family too. With
  ``own_history`` the model's own replies (not the reference ones) go into the later prompts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from models.chat_tasks import Conversation, Message
from models.chat_vocab import render
from models.llama_eval import LlamaGreedy


@dataclass(frozen=True)
class Reply:
    ids: list[int]
    text: str
    ended: bool  # EOS came within max_tokens
    prefilled: int


@dataclass
class ChatScore:
    replies: int = 0
    exact: float = 0.0
    eos: float = 0.0
    by_family: dict[str, float] = field(default_factory=dict)
    misses: list[tuple[str, str, str]] = field(default_factory=list)  # (question, expected, got)


class LlamaChat(LlamaGreedy):
    def __init__(self, gguf_path: str | Path, n_ctx: int = 512, n_threads: int = 2) -> None:
        super().__init__(gguf_path, n_ctx=n_ctx, n_threads=n_threads)
        self.eos = 2
        self.log: list[int] = []  # the tokens the KV cache holds, position = index

    def __enter__(self) -> LlamaChat:
        return self

    def reset(self) -> None:
        self.ctx.clear()
        self.log = []

    def reply(self, messages: Sequence[Message], max_tokens: int = 32) -> Reply:
        prompt = self.model.tokenize(render(messages, add_generation_prompt=True), add_bos=True,
                                     parse_special=True)
        if len(prompt) + max_tokens > self.n_ctx:
            raise ValueError(f"prompt of {len(prompt)} + {max_tokens} tokens exceeds n_ctx {self.n_ctx}")
        keep = 0
        for a, b in zip(self.log, prompt, strict=False):
            if a != b:
                break
            keep += 1
        keep = min(keep, len(prompt) - 1)  # prefill at least one token to get its logits
        if keep < len(self.log):
            self.ctx.seq_rm(0, keep, -1)
            del self.log[keep:]
        logits = self.ctx.decode(prompt[keep:], keep, 0)
        self.log.extend(prompt[keep:])
        out: list[int] = []
        while len(out) < max_tokens:
            tok = int(np.argmax(logits))
            if tok == self.eos:
                return Reply(out, self.model.detokenize(out), True, len(prompt) - keep)
            out.append(tok)
            logits = self.ctx.decode([tok], len(self.log), 0)
            self.log.append(tok)
        return Reply(out, self.model.detokenize(out), False, len(prompt) - keep)


def chat_accuracy(
    gguf_path: str | Path, conversations: Sequence[Conversation], own_history: bool = False,
    max_tokens: int = 32, n_threads: int = 2, n_ctx: int = 512,
) -> ChatScore:
    if not conversations:
        raise ValueError("no conversations")
    ok: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    score = ChatScore()
    n_exact = n_eos = 0
    with LlamaChat(gguf_path, n_ctx=n_ctx, n_threads=n_threads) as chat:
        for conv in conversations:
            chat.reset()
            history: list[Message] = []
            turn = 0
            for msg in conv.messages:
                if msg["role"] != "assistant":
                    history.append(msg)
                    continue
                got = chat.reply(history, max_tokens)
                fam = conv.families[turn]
                turn += 1
                seen[fam] += 1
                right = got.ended and got.text == msg["content"]
                ok[fam] += right
                n_exact += right
                n_eos += got.ended
                if not right:
                    score.misses.append((history[-1]["content"], msg["content"], got.text))
                history.append({"role": "assistant", "content": got.text if own_history else msg["content"]})
    score.replies = sum(seen.values())
    score.exact = n_exact / score.replies
    score.eos = n_eos / score.replies
    score.by_family = {f: ok[f] / seen[f] for f in sorted(seen)}
    return score
