"""Conversations for the project's own tiny chat model: seeded task families with one right answer.

Primitives:
- ``Message``: a chat message dict as templates take it: ``role``, ``content`` (None on an
  assistant turn that only calls tools), ``tool_calls`` (OpenAI form), ``tool_call_id``.
- ``Conversation``: the messages, the family of each assistant message, and the tools (if any).
  ``reply_text(message)``: what the model writes for an assistant message (tool calls as Hermes text).
- ``make_conversation(rng, min_turns=1, max_turns=6)``: ordinary turns drawn from ``rng``.
- ``name_recall_conversation(rng, min_gap=3, max_gap=5)``: a name, then ``gap`` turns later the
  question for it; ``tool_conversation(rng)``: tools and a task that needs 1-3 calls
  (``models.chat_tools``), maybe ordinary turns around it.
- ``conversation(split, seed, index, ..., kind="plain")`` / ``conversation_set(split, count, seed,
  ...)``: the seed-addressed forms (``split`` keeps the training and held-out streams apart;
  ``kind`` one of ``KINDS``: plain, recall, tools).
- ``user_turn(rng, family, state) -> (question, answer)``: one turn of a family.
- ``FAMILIES`` / ``FAMILY_WEIGHTS``: add, subtract, next, previous, compare, repeat, spell, name
  (tell / ask), chat (fixed replies), other (anything else -> "i do not understand.") and json
  (a question asked for JSON, or a JSON object with named keys).
- ``new_name(rng)``: a name from ``NAMES``, or (15%) a made-up one of 2-3 syllables.
- ``corpus_words()``: every word the generators write, for the vocabulary (``models.chat_vocab``).

Every reply is a function of the conversation, so accuracy is exact match. A few user turns
carry odd characters (accented letters, CJK, emoji: byte-fallback tokens) or a capital first
letter; those never change the answer. Replies are lower case and short.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]  # role, content (a string or None), tool_calls, tool_call_id

REPEAT_WORDS = (
    "red", "blue", "green", "yellow", "black", "white", "cat", "dog", "bird", "fish",
    "tree", "house", "sun", "moon", "star", "book", "car", "boat", "apple", "cake",
    "milk", "tea", "rain", "snow", "hill", "river", "king", "queen", "lamp", "box",
    "cup", "hat", "shoe", "door", "road", "ship", "stone", "flower", "cloud", "bread",
)  # fmt: skip
SPELL_WORDS = tuple(w for w in REPEAT_WORDS if len(w) <= 5)
UNICODE_WORDS = ("café", "naïve", "über", "日本", "привет", "ß", "🙂", "€5", "λ", "niño")
NAMES = (
    "anna", "bob", "carl", "dora", "emma", "fred", "gina", "hugo", "iris", "jack",
    "kate", "liam", "mona", "nick", "olga", "paul", "rosa", "sam", "tina", "vera",
    "tom", "lily", "max", "zoe", "ben", "lucy", "alex", "eva", "omar", "yuki",
    "leo", "nina", "ivan", "maria", "john", "sara", "dan", "amy", "noah", "mia",
)  # fmt: skip
# made-up names (several tokens each) teach the model to copy a name, not to recall a frequent one
_SYLLABLES = ("ka", "lo", "mi", "ra", "te", "su", "no", "vi", "da", "be", "zu", "fe", "go", "ri", "ha", "jo")
SYSTEM_LINES = (
    "you are a helpful assistant.",
    "you are a tiny chat model.",
    "be brief.",
    "answer in a few words.",
)
# (user phrasings, reply): the fixed small talk
CHAT = (
    (("hello", "hi", "hello!", "hi there", "hey"), "hello! how can i help you?"),
    (("how are you?", "how are you today?"), "i am fine, thank you."),
    (("who are you?", "what are you?"), "i am a tiny chat model."),
    (("thank you", "thanks!", "thank you very much."), "you are welcome."),
    (("bye", "goodbye", "see you later."), "goodbye!"),
    (("what can you do?", "help"), "i can add, count, compare, repeat and spell."),
    (("tell me a joke.", "say something funny."), "i do not know any jokes."),
)
DONT_UNDERSTAND = "i do not understand."
DONT_KNOW = "i do not know."

FAMILIES = ("add", "subtract", "next", "previous", "compare", "repeat", "spell", "name", "chat", "other", "json")
FAMILY_WEIGHTS = (12, 8, 10, 6, 12, 14, 10, 14, 10, 8, 8)
_JSON_INNER = ("add", "subtract", "next", "previous", "compare", "spell", "repeat", "name")

_PHRASES = {
    "add": ("what is {a} plus {b}?", "{a} plus {b}?", "what is {a} + {b}?", "add {a} and {b}."),
    "subtract": ("what is {a} minus {b}?", "{a} minus {b}?", "what is {a} - {b}?"),
    "next": ("what comes after {n}?", "what number comes after {n}?", "count on from {n}."),
    "previous": ("what comes before {n}?", "what number comes before {n}?"),
    "bigger": ("is {a} bigger than {b}?", "is {a} more than {b}?"),
    "smaller": ("is {a} smaller than {b}?", "is {a} less than {b}?"),
    "repeat": ("repeat after me: {w}", "say {w}", "repeat: {w}"),
    "spell": ("spell {w}", "how do you spell {w}?", "spell the word {w}."),
    "tell": ("my name is {n}.", "i am {n}.", "call me {n}."),
    "ask": ("what is my name?", "do you know my name?", "who am i?"),
}
_TELL_REPLY = "nice to meet you, {n}."
_OTHER_WORDS = ("the", "a", "of", "and", "it", "blah", "hmm", "ok", "so", "why", "where", "when")
# odd characters: 2-, 3- and 4-byte UTF-8 and ASCII symbols outside the word pieces
_ODD = ("é", "ß", "ñ", "ü", "ø", "ж", "λ", "中", "日", "→", "★", "♥", "€", "™", "🙂", "🚀", "🎉", "~", "#", "*", "@")
_UNICODE_RANGES = ((0x00A1, 0x024F), (0x0370, 0x03FF), (0x0400, 0x04FF), (0x3041, 0x30FF),
                   (0x4E00, 0x9FFF), (0x1F300, 0x1F64F))


@dataclass
class Conversation:
    messages: list[Message]
    families: list[str] = field(default_factory=list)  # one per assistant message
    tools: list[dict[str, Any]] | None = None  # OpenAI-style tool specs the template renders

    @property
    def n_turns(self) -> int:
        return sum(m["role"] == "user" for m in self.messages)

    def replies(self) -> list[str]:
        return [reply_text(m) for m in self.messages if m["role"] == "assistant"]


def reply_text(message: Message) -> str:
    """What the model writes for an assistant message: its content, then each tool call as Hermes text."""
    from models.chat_tools import call_text

    calls = [c["function"] for c in message.get("tool_calls") or ()]
    return (message["content"] or "") + "".join(call_text(c["name"], json.loads(c["arguments"])) for c in calls)


@dataclass
class _State:
    name: str | None = None  # the name the user gave last, if any


def _odd_char(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return rng.choice(_ODD)
    lo, hi = rng.choice(_UNICODE_RANGES)
    return chr(rng.randint(lo, hi))


def _garble(rng: random.Random, text: str) -> str:
    """Odd characters before or after the text, or a capital first letter: the answer stays."""
    r = rng.random()
    if r < 0.45:
        return text + " " + "".join(_odd_char(rng) for _ in range(rng.randint(1, 3)))
    if r < 0.7:
        return "".join(_odd_char(rng) for _ in range(rng.randint(1, 2))) + " " + text
    return text[:1].upper() + text[1:]


def new_name(rng: random.Random, made_up_p: float = 0.15) -> str:
    if rng.random() < made_up_p:
        return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))
    return rng.choice(NAMES)


def _other(rng: random.Random) -> str:
    """A user turn no family owns: random words, numbers and odd characters."""
    parts: list[str] = []
    for _ in range(rng.randint(1, 6)):
        r = rng.random()
        if r < 0.4:
            parts.append(rng.choice(_OTHER_WORDS + REPEAT_WORDS))
        elif r < 0.6:
            parts.append(str(rng.randint(0, 999)))
        else:
            parts.append("".join(_odd_char(rng) for _ in range(rng.randint(1, 4))))
    return " ".join(parts)


def user_turn(rng: random.Random, family: str, state: _State) -> tuple[str, str]:
    """(question, answer) of one turn; ``state`` carries the name across turns."""
    phrase = rng.choice
    if family == "add":
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        return phrase(_PHRASES["add"]).format(a=a, b=b), f"{a + b}."
    if family == "subtract":
        a = rng.randint(0, 9)
        b = rng.randint(0, a)
        return phrase(_PHRASES["subtract"]).format(a=a, b=b), f"{a - b}."
    if family == "next":
        n = rng.randint(0, 99)
        return phrase(_PHRASES["next"]).format(n=n), f"{n + 1}."
    if family == "previous":
        n = rng.randint(1, 100)
        return phrase(_PHRASES["previous"]).format(n=n), f"{n - 1}."
    if family == "compare":
        a, b = rng.sample(range(100) if rng.random() < 0.6 else range(10), 2)
        if rng.random() < 0.5:
            return phrase(_PHRASES["bigger"]).format(a=a, b=b), "yes." if a > b else "no."
        return phrase(_PHRASES["smaller"]).format(a=a, b=b), "yes." if a < b else "no."
    if family == "repeat":
        words = [rng.choice(REPEAT_WORDS) for _ in range(rng.randint(1, 5))]
        if rng.random() < 0.15:
            words[rng.randrange(len(words))] = rng.choice(UNICODE_WORDS)
        said = " ".join(words)
        return phrase(_PHRASES["repeat"]).format(w=said), said
    if family == "spell":
        w = rng.choice(SPELL_WORDS)
        return phrase(_PHRASES["spell"]).format(w=w), "-".join(w) + "."
    if family == "name":
        if state.name is None or rng.random() < 0.4:
            if state.name is None and rng.random() < 0.25:
                return phrase(_PHRASES["ask"]), DONT_KNOW
            state.name = new_name(rng)
            return phrase(_PHRASES["tell"]).format(n=state.name), _TELL_REPLY.format(n=state.name)
        return phrase(_PHRASES["ask"]), f"{state.name}."
    if family == "chat":
        asks, reply = rng.choice(CHAT)
        return rng.choice(asks), reply
    if family == "other":
        return _other(rng), DONT_UNDERSTAND
    if family == "json":
        inner = rng.choice(_JSON_INNER)
        if inner == "name" and state.name is None:
            inner = "add"
        question, answer = user_turn(rng, inner, state)
        while answer.startswith("nice to meet you"):
            question, answer = user_turn(rng, inner, state)
        from models.chat_tools import json_turn

        return json_turn(rng, question, answer)
    raise ValueError(f"unknown family {family!r} (known: {', '.join(FAMILIES)})")


def make_conversation(
    rng: random.Random, min_turns: int = 1, max_turns: int = 6, garble_p: float = 0.12,
    system_p: float = 0.3, families: Sequence[str] = FAMILIES,
) -> Conversation:
    if not 1 <= min_turns <= max_turns:
        raise ValueError(f"need 1 <= min_turns <= max_turns, got {min_turns}, {max_turns}")
    weights = [FAMILY_WEIGHTS[FAMILIES.index(f)] for f in families]
    messages: list[Message] = []
    if rng.random() < system_p:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_LINES)})
    state, fams = _State(), []
    for _ in range(rng.randint(min_turns, max_turns)):
        fam = rng.choices(families, weights)[0]
        question, answer = user_turn(rng, fam, state)
        if fam not in ("repeat", "other") and rng.random() < garble_p:
            question = _garble(rng, question)
        messages.append({"role": "user", "content": question})
        messages.append({"role": "assistant", "content": answer})
        fams.append(fam)
    return Conversation(messages, fams)


_FILLER = ("subtract", "next", "previous", "compare", "repeat", "spell", "chat", "other")


class _Builder:
    def __init__(self, rng: random.Random, system_p: float, garble_p: float = 0.12) -> None:
        self.rng, self.garble_p = rng, garble_p
        self.messages: list[Message] = []
        self.families: list[str] = []
        self.state = _State()
        if rng.random() < system_p:
            self.messages.append({"role": "system", "content": rng.choice(SYSTEM_LINES)})

    def turn(self, family: str, question: str, answer: str) -> None:
        if family not in ("repeat", "other") and self.rng.random() < self.garble_p:
            question = _garble(self.rng, question)
        self.messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        self.families.append(family)

    def filler(self, n: int) -> None:
        for _ in range(n):
            fam = self.rng.choice(_FILLER)
            self.turn(fam, *user_turn(self.rng, fam, self.state))


def name_recall_conversation(rng: random.Random, min_gap: int = 3, max_gap: int = 5,
                             made_up_p: float = 0.15) -> Conversation:
    """A name, then ``min_gap``-``max_gap`` turns later (other families between) the question for it."""
    b = _Builder(rng, system_p=0.3)
    b.filler(rng.randint(0, 1))
    name = b.state.name = new_name(rng, made_up_p)
    b.turn("name", rng.choice(_PHRASES["tell"]).format(n=name), _TELL_REPLY.format(n=name))
    b.filler(rng.randint(min_gap, max_gap) - 1)
    b.turn("name", rng.choice(_PHRASES["ask"]), f"{name}.")
    return Conversation(b.messages, b.families)


def tool_conversation(rng: random.Random, kind_weights: tuple[float, ...] | None = None) -> Conversation:
    """Tools, then a task that needs 1-3 calls (see ``models.chat_tools``; ``kind_weights``: its
    mix of task kinds, the held-out one by default), maybe ordinary turns around it."""
    from models.chat_tools import KIND_WEIGHTS, tool_task

    tools, exchange, fams = tool_task(rng, kind_weights or KIND_WEIGHTS)
    b = _Builder(rng, system_p=0.3)
    b.filler(rng.choice((0, 0, 1)))
    b.messages += exchange
    b.families += fams
    b.filler(rng.choice((0, 0, 1)))
    return Conversation(b.messages, b.families, tools)


KINDS = ("plain", "recall", "tools")


def conversation(split: str, seed: int, index: int, min_turns: int = 1, max_turns: int = 6,
                 kind: str = "plain", **kw: Any) -> Conversation:
    """The ``index``-th conversation of a stream; the same arguments give the same text anywhere.

    ``kind``: ``plain`` (``make_conversation``), ``recall`` (``name_recall_conversation``, ``kw``
    its gaps) or ``tools`` (``tool_conversation``)."""
    rng = random.Random(f"chat/{split}/{seed}/{index}")
    if kind == "plain":
        return make_conversation(rng, min_turns, max_turns)
    if kind == "recall":
        return name_recall_conversation(rng, **kw)
    if kind == "tools":
        return tool_conversation(rng)
    raise ValueError(f"unknown conversation kind {kind!r} (known: {', '.join(KINDS)})")


def conversation_set(
    split: str, count: int, seed: int, min_turns: int = 1, max_turns: int = 6, kind: str = "plain", **kw: Any
) -> list[Conversation]:
    return [conversation(split, seed, i, min_turns, max_turns, kind, **kw) for i in range(count)]


def corpus_words() -> list[str]:
    """The lower-case ASCII words the generator writes, sorted (for the word pieces)."""
    texts: list[str] = [*REPEAT_WORDS, *NAMES, *SYSTEM_LINES, *_OTHER_WORDS, DONT_UNDERSTAND, DONT_KNOW,
                        _TELL_REPLY]
    for asks, reply in CHAT:
        texts += [*asks, reply]
    for phrases in _PHRASES.values():
        texts += phrases
    from models.chat_tools import tool_words

    words: set[str] = set(tool_words())
    for text in texts:
        for w in text.replace("{", " ").replace("}", " ").split():
            w = w.strip(".,!?:+-")
            if w.isascii() and w.isalpha() and w.islower() and w not in ("a", "b", "n", "w"):
                words.add(w)
    return sorted(words | {"a", "yes", "no"})
