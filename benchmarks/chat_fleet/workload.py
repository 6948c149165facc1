"""The chat-fleet workload: the same conversations, message for message, for every server.

Primitives:
- ``ChatWorkload(conversations, slots, clients, turns, history_tokens, user_tokens, reply_tokens,
  seed=0)``: the sizes; ``conversations_of(client)`` (client ``c`` takes conversations ``c``,
  ``c + clients``, ...), ``timed_turns``.
- ``PRESETS``: the three configurations of issue #46 by name (``engine-free``: the shared
  stories260K model; ``realistic-16`` / ``realistic-64``: ``benchmarks.realistic_model``'s shape).
- ``Count`` (a text's tokens, by the model's tokenizer) and ``Render`` (messages through the
  model's chat template): what sizes the messages.
- ``words(rng, n_tokens, count) -> str``: random words of one or two letters, as few as make
  ``n_tokens`` tokens.
- ``Conversation(history, user_turns)``: the messages a conversation starts with (earlier exchanges,
  ending with a user message: the untimed opening turn answers it) and its timed user messages.
- ``build_conversations(w, count, render, repeat=0) -> list[Conversation]``: each conversation's
  history, exchanges of a ``user_tokens`` message and a ``reply_tokens`` one grown until its
  rendering holds ``history_tokens``, and its ``turns`` user messages of ``user_tokens`` tokens.
  Seeded by (seed, repeat, conversation): the same on every call, another set per repeat (a server
  meets nothing it has cached from an earlier repeat).

The replies of the timed turns are each server's own (greedy, ``reply_tokens`` of them); the rest is
the same text for every server, so every server is sent the same new tokens each turn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

Message = dict[str, str]
Count = Callable[[str], int]
Render = Callable[[list[Message]], str]
LETTERS = "abcdefghijklmnopqrstuvwxyz"

# issue #46: 8 clients, each turn 32 new tokens and 16 generated, 4 sequence slots, 2 threads
PRESETS: dict[str, dict[str, Any]] = {
    "engine-free": {"model": "stories260K", "conversations": 16, "slots": 4, "clients": 8, "turns": 3,
                    "history_tokens": 256, "user_tokens": 32, "reply_tokens": 16},
    "realistic-16": {"model": "realistic", "conversations": 16, "slots": 4, "clients": 8, "turns": 3,
                     "history_tokens": 512, "user_tokens": 32, "reply_tokens": 16},
    "realistic-64": {"model": "realistic", "conversations": 64, "slots": 4, "clients": 8, "turns": 3,
                     "history_tokens": 1024, "user_tokens": 32, "reply_tokens": 16},
}


@dataclass(frozen=True)
class ChatWorkload:
    conversations: int = 16
    slots: int = 4
    clients: int = 8
    turns: int = 3
    history_tokens: int = 256
    user_tokens: int = 32
    reply_tokens: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        sizes = (self.conversations, self.slots, self.clients, self.turns, self.user_tokens, self.reply_tokens)
        if min(sizes) < 1 or self.history_tokens < 0:
            raise ValueError(f"every size of a chat workload must be >= 1 (history_tokens >= 0): {self}")
        if self.clients > self.conversations:
            raise ValueError(f"clients ({self.clients}) must not exceed conversations ({self.conversations}): "
                             "a conversation takes one turn at a time")

    def conversations_of(self, client: int) -> list[int]:
        return list(range(client, self.conversations, self.clients))

    @property
    def timed_turns(self) -> int:
        return self.conversations * self.turns


@dataclass(frozen=True)
class Conversation:
    history: list[Message]
    user_turns: list[str]


def words(rng: np.random.Generator, n_tokens: int, count: Count) -> str:
    out: list[str] = []
    while not out or count(" ".join(out)) < n_tokens:
        out.append("".join(rng.choice(list(LETTERS), size=int(rng.integers(1, 3)))))
    return " ".join(out)


def _conversation(w: ChatWorkload, count: Count, render: Render, rng: np.random.Generator) -> Conversation:
    history: list[Message] = [{"role": "user", "content": words(rng, w.user_tokens, count)}]
    while count(render(history)) < w.history_tokens:
        history += [{"role": "assistant", "content": words(rng, w.reply_tokens, count)},
                    {"role": "user", "content": words(rng, w.user_tokens, count)}]
    return Conversation(history, [words(rng, w.user_tokens, count) for _ in range(w.turns)])


def build_conversations(w: ChatWorkload, count: Count, render: Render, repeat: int = 0) -> list[Conversation]:
    return [_conversation(w, count, render, np.random.default_rng((w.seed, repeat, i)))
            for i in range(w.conversations)]
