"""Passkey retrieval tasks and the word-level tokenizer of the project's own model (no torch).

Primitives:
- ``VOCAB``: the token list (id = index); ``BOS_ID`` = 1, ``EOS_ID`` = 2, ``UNK_ID`` = 0.
- ``encode(text, bos=False) -> list[int]`` / ``decode(ids) -> str``: whitespace word tokenizer;
  numbers are split into one token per digit ("48213" -> 4 8 2 1 3).
- ``PasskeyTask``: one prompt (token ids, starting with BOS), its answer digits, and where the
  needles and the question sit in the prompt (half-open token ranges).
- ``make_single_task(rng, n_tokens, depth)``: family 1, one passkey among filler at a relative
  depth, then "what is the pass key ? the pass key is" -> the digits.
- ``make_multi_task(rng, n_tokens, n_needles, depth)``: family 2, several "the pass key of <name>
  is <digits> ." needles, the question asks for one of them (the target sits at ``depth``).
- ``make_task(family, seed, ...)`` and ``fixed_task_set(family, count, seed, ...)``: the
  seed-addressed forms that tests and benchmarks use (same seed -> same prompt, every platform).

Depth is the fraction of the filler that precedes the (target) needle: 0.0 puts it right after
BOS, 1.0 right before the question. Needles are inserted at sentence boundaries of the filler.
Prompt lengths are exact: ``len(task.prompt_ids) == n_tokens``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

UNK_ID = 0
BOS_ID = 1
EOS_ID = 2
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
DIGITS = tuple("0123456789")
PUNCT = (".", "?", ",")
TASK_WORDS = ("what", "is", "the", "pass", "key", "of", "remember", "it")
NAMES = (
    "anna", "bob", "carl", "dora", "emma", "fred", "gina", "hugo", "iris", "jack",
    "kate", "liam", "mona", "nick", "olga", "paul", "rosa", "sam", "tina", "vera",
)  # fmt: skip

# Filler grammar (no task words except "the"; no names, so needles stay unambiguous).
_NOUNS = (
    "cat", "dog", "bird", "fish", "tree", "house", "river", "hill", "road", "boat",
    "car", "girl", "boy", "man", "woman", "king", "queen", "farmer", "baker", "child",
    "garden", "forest", "town", "ship", "horse", "stone", "flower", "cloud", "lamp", "box",
)  # fmt: skip
_ADJS = (
    "big", "small", "red", "green", "blue", "old", "young", "happy", "quiet", "dark",
    "bright", "tall", "little", "warm", "cold",
)  # fmt: skip
_VERBS_T = ("saw", "found", "liked", "took", "made", "painted", "followed", "helped", "carried", "watched")
_VERBS_I = ("slept", "ran", "sang", "waited", "smiled", "jumped", "danced", "rested")
_ADVS = ("slowly", "quickly", "again", "today", "there", "softly", "later", "here")
_PREPS = ("near", "under", "behind", "over", "into", "by")
_GLUE = ("a", "then", "and", "was", "very", "one", "day", "grass", "sky", "sun", "rain", "night")

VOCAB: tuple[str, ...] = (
    SPECIAL_TOKENS
    + DIGITS
    + PUNCT
    + TASK_WORDS
    + NAMES
    + _NOUNS
    + _ADJS
    + _VERBS_T
    + _VERBS_I
    + _ADVS
    + _PREPS
    + _GLUE
)
TOKEN_TO_ID: dict[str, int] = {t: i for i, t in enumerate(VOCAB)}
if len(TOKEN_TO_ID) != len(VOCAB):  # pragma: no cover - guards edits of the word lists
    raise RuntimeError("duplicate word in the passkey vocabulary")

DEFAULT_DIGITS = 5
FAMILY_SINGLE = 1
FAMILY_MULTI = 2


# ---------------------------------------------------------------------------------------------
# tokenizer


def encode(text: str, bos: bool = False) -> list[int]:
    """Whitespace-split words to ids; runs of digits become one token per digit.

    Unknown words raise ``KeyError`` naming the word (the vocabulary is closed on purpose).
    """
    ids = [BOS_ID] if bos else []
    for word in text.split():
        if word.isdigit():
            ids.extend(TOKEN_TO_ID[c] for c in word)
            continue
        try:
            ids.append(TOKEN_TO_ID[word])
        except KeyError:
            raise KeyError(f"word {word!r} is not in the passkey vocabulary") from None
    return ids


def decode(ids: Sequence[int]) -> str:
    """Ids back to text; consecutive digits join into one number; BOS/EOS are dropped."""
    out: list[str] = []
    prev_digit = False
    for i in ids:
        i = int(i)
        if not 0 <= i < len(VOCAB):
            raise ValueError(f"token id {i} outside the vocabulary (size {len(VOCAB)})")
        if i in (BOS_ID, EOS_ID):
            prev_digit = False
            continue
        tok = VOCAB[i]
        if tok in DIGITS and prev_digit:
            out[-1] += tok
        else:
            out.append(tok)
        prev_digit = tok in DIGITS
    return " ".join(out)


# ---------------------------------------------------------------------------------------------
# tasks


@dataclass(frozen=True)
class PasskeyTask:
    """One retrieval prompt. Ranges are half-open ``(start, end)`` token positions in the prompt."""

    family: int
    prompt_ids: list[int]
    answer_ids: list[int]  # the digits only; a model should follow them with EOS
    needle_spans: list[tuple[int, int]]
    target: int  # index into needle_spans of the needle that the question asks for
    question_span: tuple[int, int]  # the question: the observation window for SnapKV
    depth: float  # requested relative depth of the target needle
    keys: list[str] = field(default_factory=list)  # family 2: the name of each needle

    @property
    def answer(self) -> str:
        return "".join(VOCAB[i] for i in self.answer_ids)

    @property
    def target_span(self) -> tuple[int, int]:
        return self.needle_spans[self.target]

    @property
    def n_tokens(self) -> int:
        return len(self.prompt_ids)

    def training_ids(self) -> list[int]:
        """Prompt + answer digits + EOS: one training sequence."""
        return self.prompt_ids + self.answer_ids + [EOS_ID]


def _sentence(rng: random.Random) -> list[str]:
    kind = rng.randrange(6)
    n1, n2 = rng.choice(_NOUNS), rng.choice(_NOUNS)
    if kind == 0:
        return ["the", rng.choice(_ADJS), n1, rng.choice(_VERBS_T), "the", n2, "."]
    if kind == 1:
        return ["a", n1, rng.choice(_VERBS_I), rng.choice(_PREPS), "the", rng.choice(_ADJS), n2, "."]
    if kind == 2:
        return ["then", "the", n1, rng.choice(_VERBS_I), rng.choice(_ADVS), "."]
    if kind == 3:
        return ["one", "day", "the", n1, "was", "very", rng.choice(_ADJS), "."]
    if kind == 4:
        return ["the", n1, "and", "the", n2, rng.choice(_VERBS_I), ",", "then", rng.choice(_VERBS_I), "."]
    return ["the", rng.choice(("grass", "sky", "sun", "rain", "night")), "was", rng.choice(_ADJS), "."]


def _filler(rng: random.Random, n: int) -> tuple[list[int], list[int]]:
    """``n`` filler ids ending with "." (when n > 0) and the sentence-start offsets (incl. 0, n)."""
    words: list[str] = []
    starts = [0]
    while len(words) < n:
        words.extend(_sentence(rng))
        starts.append(len(words))
    words = words[:n]
    if n > 0:
        words[-1] = "."
    starts = sorted({s for s in starts if s < n} | {n})
    return [TOKEN_TO_ID[w] for w in words], starts


def _digits(rng: random.Random, n_digits: int) -> list[int]:
    return [TOKEN_TO_ID[str(rng.randrange(10))] for _ in range(n_digits)]


def _assemble(
    rng: random.Random,
    family: int,
    n_tokens: int,
    needles: list[list[int]],
    depths: list[float],
    question: list[int],
    target: int,
    depth: float,
    answer: list[int],
    keys: list[str],
) -> PasskeyTask:
    fixed = 1 + sum(len(n) for n in needles) + len(question)
    n_fill = n_tokens - fixed
    if n_fill < 0:
        raise ValueError(
            f"n_tokens={n_tokens} too short: BOS + {len(needles)} needle(s) + question need {fixed} tokens"
        )
    filler, starts = _filler(rng, n_fill)
    # Each needle goes to the sentence boundary nearest to its depth; ties keep needle order.
    cuts = [min(starts, key=lambda s, d=d: (abs(s - d * n_fill), s)) for d in depths]
    order = sorted(range(len(needles)), key=lambda i: (cuts[i], i))
    prompt = [BOS_ID]
    spans: list[tuple[int, int]] = [(0, 0)] * len(needles)
    pos = 0
    for i in order:
        prompt.extend(filler[pos : cuts[i]])
        pos = cuts[i]
        spans[i] = (len(prompt), len(prompt) + len(needles[i]))
        prompt.extend(needles[i])
    prompt.extend(filler[pos:])
    q0 = len(prompt)
    prompt.extend(question)
    assert len(prompt) == n_tokens
    return PasskeyTask(
        family=family,
        prompt_ids=prompt,
        answer_ids=answer,
        needle_spans=spans,
        target=target,
        question_span=(q0, len(prompt)),
        depth=depth,
        keys=keys,
    )


def _check_depth(depth: float) -> float:
    depth = float(depth)
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must lie in [0, 1], got {depth}")
    return depth


def make_single_task(
    rng: random.Random, n_tokens: int, depth: float | None = None, n_digits: int = DEFAULT_DIGITS
) -> PasskeyTask:
    """Family 1: "the pass key is <digits> . remember it ." among filler; question at the end."""
    depth = _check_depth(rng.random() if depth is None else depth)
    answer = _digits(rng, n_digits)
    needle = encode("the pass key is") + answer + encode(". remember it .")
    question = encode("what is the pass key ? the pass key is")
    return _assemble(rng, FAMILY_SINGLE, n_tokens, [needle], [depth], question, 0, depth, answer, [])


def make_multi_task(
    rng: random.Random,
    n_tokens: int,
    n_needles: int = 4,
    depth: float | None = None,
    n_digits: int = DEFAULT_DIGITS,
) -> PasskeyTask:
    """Family 2: ``n_needles`` "the pass key of <name> is <digits> ." needles with distinct names and
    distinct passkeys; the question asks for the target, which sits at ``depth`` (the others at
    uniformly random depths)."""
    if not 1 <= n_needles <= len(NAMES):
        raise ValueError(f"n_needles must lie in [1, {len(NAMES)}], got {n_needles}")
    depth = _check_depth(rng.random() if depth is None else depth)
    names = rng.sample(NAMES, n_needles)
    answers: list[list[int]] = []
    while len(answers) < n_needles:
        a = _digits(rng, n_digits)
        if a not in answers:
            answers.append(a)
    target = rng.randrange(n_needles)
    depths = [depth if i == target else rng.random() for i in range(n_needles)]
    needles = [
        encode(f"the pass key of {nm} is") + a + encode(".") for nm, a in zip(names, answers, strict=True)
    ]
    tname = names[target]
    question = encode(f"what is the pass key of {tname} ? the pass key of {tname} is")
    return _assemble(
        rng, FAMILY_MULTI, n_tokens, needles, depths, question, target, depth, answers[target], names
    )


def make_task(
    family: int,
    seed: int,
    n_tokens: int,
    depth: float | None = None,
    n_needles: int = 4,
    n_digits: int = DEFAULT_DIGITS,
) -> PasskeyTask:
    """The task of ``family`` (1 or 2) addressed by ``seed``: same arguments, same prompt."""
    rng = random.Random(f"passkey/{family}/{seed}")
    if family == FAMILY_SINGLE:
        return make_single_task(rng, n_tokens, depth, n_digits)
    if family == FAMILY_MULTI:
        return make_multi_task(rng, n_tokens, n_needles, depth, n_digits)
    raise ValueError(f"family must be 1 (single passkey) or 2 (several key/value needles), got {family}")


def fixed_task_set(
    family: int,
    count: int = 50,
    seed: int = 0,
    n_tokens: int | tuple[int, int] = (200, 400),
    depth: float | tuple[float, float] = (0.0, 1.0),
    n_needles: int | tuple[int, int] = 4,
    n_digits: int = DEFAULT_DIGITS,
) -> list[PasskeyTask]:
    """``count`` tasks; ranges ``(lo, hi)`` (inclusive) are drawn per task from a seeded stream.

    ``fixed_task_set(1, 50, seed=0, depth=(1/3, 2/3))`` is the 50-prompt middle-third set.
    """
    rng = random.Random(f"passkey-set/{family}/{seed}")
    tasks = []
    for i in range(count):
        n = n_tokens if isinstance(n_tokens, int) else rng.randint(*n_tokens)
        d = depth if isinstance(depth, (int, float)) else rng.uniform(*depth)
        k = n_needles if isinstance(n_needles, int) else rng.randint(*n_needles)
        tasks.append(make_task(family, seed * 1_000_003 + i, n, d, k, n_digits))
    return tasks
