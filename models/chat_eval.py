"""The chat model in llama.cpp: greedy replies that stop at EOS, and their accuracy (no torch).

Primitives:
- ``LlamaChat(gguf_path, n_ctx=512, n_threads=2)``: one model + context (f32 KV, full cache) that
  keeps one conversation's tokens in its KV cache. ``reply(messages, max_tokens=48, tools=None)`` renders the
  messages with the chat template (``add_generation_prompt``), tokenizes them with the model's own
  tokenizer (special tokens parsed), prefills only what the cache does not hold yet (dropping any
  tail that differs), then decodes greedily until EOS or ``max_tokens``. It returns a ``Reply``.
- ``Reply``: the generated ids (EOS excluded), their text, whether EOS ended them, and how many
  prompt tokens were prefilled for it.
- ``chat_accuracy(gguf_path, conversations, own_history=False) -> ChatScore``: every assistant
  turn of every conversation, in order; ``exact`` is the share of replies equal to the reference
  (a JSON reply whose values the question leaves open: ``json_reply_right``),
  ``eos`` the share that ended with EOS within ``max_tokens``; per family too. With
  ``own_history`` the model's own replies (not the reference ones) go into the later prompts.
  Conversations with tools render them (``Conversation.tools``); a reply that calls a tool is
  compared with the Hermes text of its ``tool_calls`` (``chat_tasks.reply_text``).
- ``JSON_SCHEMAS`` (``json_object`` and two schemas) / ``json_questions(count)`` (one-turn questions
  of every family, held out): what the JSON-mode scores use.
- ``json_accuracy(gguf_path, questions, schema) -> JsonScore``: one-turn replies decoded under
  the grammar of a JSON schema (kvres's executor and sampler, as ``response_format`` runs them):
  the share that parses and the share that ends with EOS within ``max_tokens``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from models.chat_tasks import Conversation, Message, conversation_set, reply_text
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

    def reply(self, messages: Sequence[Message], max_tokens: int = 48,
              tools: Sequence[dict[str, Any]] | None = None) -> Reply:
        prompt = self.model.tokenize(render(messages, add_generation_prompt=True, tools=tools), add_bos=True,
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


def json_reply_right(question: str, expected: str, got: str) -> bool:
    """A JSON-family reply whose values the question does not fix: ``json with name and age`` wants
    an object with those keys and values of the reference's types; a question asked for JSON wants
    one key (``answer``, ``result`` or ``value``: any) with the question's answer."""
    import json

    try:
        want, have = json.loads(expected), json.loads(got)
    except ValueError:
        return False
    if not isinstance(have, dict) or len(have) != len(want):
        return False
    if "json with" in question or "json object with" in question:
        return set(have) == set(want) and all(type(have[k]) is type(want[k]) for k in want)
    return list(have.values()) == list(want.values())


def chat_accuracy(
    gguf_path: str | Path, conversations: Sequence[Conversation], own_history: bool = False,
    max_tokens: int = 64, n_threads: int = 2, n_ctx: int = 512,
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
                got = chat.reply(history, max_tokens, conv.tools)
                fam = conv.families[turn]
                turn += 1
                seen[fam] += 1
                expected = reply_text(msg)
                right = got.ended and (got.text == expected or fam == "json" and json_reply_right(
                    str(history[-1]["content"]), expected, got.text))
                ok[fam] += right
                n_exact += right
                n_eos += got.ended
                if not right:
                    score.misses.append((str(history[-1]["content"]), expected, got.text))
                history.append({"role": "assistant", "content": got.text} if own_history else msg)
    score.replies = sum(seen.values())
    score.exact = n_exact / score.replies
    score.eos = n_eos / score.replies
    score.by_family = {f: ok[f] / seen[f] for f in sorted(seen)}
    return score


JSON_SCHEMAS = {
    "json_object": {"type": "object"},
    "ok_n": {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
             "maximum": 9}}, "required": ["ok", "n"], "additionalProperties": False},
    "name_age": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                 "required": ["name", "age"]},
}


def json_questions(count: int) -> list[str]:
    """One-turn questions of every family (JSON asked for or not) from a held-out stream."""
    return [c.messages[-2]["content"] for c in conversation_set("heldout-json", count, seed=7, max_turns=1)]


@dataclass
class JsonScore:
    replies: int = 0
    parsed: float = 0.0  # share whose text is JSON that parses
    eos: float = 0.0  # share that ended with EOS within max_tokens
    failures: list[tuple[str, str]] = field(default_factory=list)  # (question, text)


def json_accuracy(
    gguf_path: str | Path, questions: Sequence[str], schema: dict[str, Any], max_tokens: int = 48,
    n_threads: int = 1,
) -> JsonScore:
    """Greedy one-turn replies constrained by the JSON schema's grammar (kvres's llama.cpp executor and
    sampler: what ``response_format`` does): how many parse and end with EOS."""
    import json

    from kvres.actors.engines.llama import LlamaExecutor
    from kvres.actors.sampling import SamplingParams

    if not questions:
        raise ValueError("no questions")
    score = JsonScore()
    n_parsed = n_eos = 0
    ex = LlamaExecutor(gguf_path, n_ctx=512, n_seq_max=1, n_threads=n_threads, type_k="f32", type_v="f32")
    try:
        eog = ex.end_of_generation()
        for i, question in enumerate(questions):
            prompt = ex.tokenize(render([{"role": "user", "content": question}], add_generation_prompt=True),
                                 add_bos=True, special=True)
            ex.open_session(f"q{i}")
            sampler = ex.sampler(SamplingParams(json_schema=schema))
            try:
                logits = ex.append(f"q{i}", prompt)
                sampler.prime(prompt)
                out: list[int] = []
                ended = False
                while len(out) < max_tokens:
                    token = sampler.sample(logits)
                    sampler.accept(token)
                    if token in eog:
                        ended = True
                        break
                    out.append(token)
                    logits = ex.append(f"q{i}", [token])
            finally:
                sampler.close()
                ex.close_session(f"q{i}")
            text = ex.detokenize(out)
            try:
                json.loads(text)
                ok = True
            except ValueError:
                ok = False
            n_parsed += ok
            n_eos += ended
            if not (ok and ended):
                score.failures.append((question, text))
    finally:
        ex.close()
    score.replies = len(questions)
    score.parsed, score.eos = n_parsed / score.replies, n_eos / score.replies
    return score
