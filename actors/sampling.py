"""Next-token choice from logits: the parameters, the sampler protocol and its numpy implementation.

Primitives:
- ``SamplingParams``: a frozen pydantic model, every field checked with a message naming it:
  ``temperature`` (finite, >= 0; 0 = greedy), ``seed`` (int in ``[0, 2**32 - 1)`` or None),
  ``top_k`` (>= 0, 0 = off), ``top_p`` (0 < p <= 1), ``min_p`` (0 <= p < 1), ``repeat_penalty``
  (> 0, 1 = off), ``frequency_penalty`` / ``presence_penalty`` (finite, 0 = off),
  ``penalty_last_n`` (>= 0: how many of the last tokens the penalties count), ``grammar`` (GBNF text,
  root rule ``root``) or ``json_schema`` (a dict; not both), ``logprobs`` (whether the caller wants
  the chosen tokens' log-probabilities), ``top_logprobs`` (0 to ``TOP_LOGPROBS_LIMIT``: how many of
  the most likely tokens of each step to give with their log-probabilities; implies ``logprobs``),
  ``logit_bias`` (token id -> a bias in [-100, 100] added to that token's logit before sampling).
  ``needs_grammar``, ``penalized``, ``filtered``.
- ``Sampler``: the protocol every engine's sampler follows: ``prime(recent_tokens)`` (the log's
  last tokens, for the penalties; replaces what it held), ``sample(logits) -> int``,
  ``accept(token)`` (a token committed to the log: grammar state and penalties move on),
  ``logprob(logits, token) -> float`` (log-softmax of the raw logits), ``close()`` (free what the
  engine holds; also done when the sampler is collected). Both samplers add ``logit_bias`` to the
  logits before their filters (``biased``); log-probabilities are of the engine's logits, unbiased.
- ``TokenSampler(temperature=0.0, seed=None, params=None)``: the numpy ``Sampler`` of every
  parameter except a grammar (``CapabilityError``). Greedy (argmax) at temperature 0, otherwise one
  uniform draw from a numpy generator seeded with ``seed`` against the CDF of softmax(logits /
  temperature), so the same seed gives the same tokens; with only (temperature, seed) set it draws
  exactly as it always has. Order of the filters (llama.cpp's): penalties, top-k, top-p, min-p,
  temperature.
- ``log_softmax_at(logits, token) -> float``; ``top_log_softmax(logits, k) -> [(token, logprob)]``
  (the ``k`` most likely tokens, most likely first); ``biased(logits, bias) -> logits``;
  ``check_bias(bias, n_vocab)`` (a token id outside the vocabulary: ``TokenIdError``).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, field_validator, model_validator

from kvres.policy.errors import CapabilityError, KvresError
from kvres.policy.tokens import TokenIdError


class GrammarError(KvresError, ValueError):
    """A grammar (GBNF, or one made from a JSON schema) the engine cannot parse."""


SEED_LIMIT = 2**32 - 1  # llama.cpp takes a 32-bit seed and reads 0xFFFFFFFF as "random"
TOP_LOGPROBS_LIMIT = 20  # OpenAI's limit on top_logprobs
LOGIT_BIAS_LIMIT = 100.0  # OpenAI's: a bias is in [-100, 100]


class SamplingParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float = 0.0
    seed: StrictInt | None = None
    top_k: StrictInt = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: StrictInt = 64
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt = 0
    logit_bias: dict[StrictInt, float] | None = None

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, v: float) -> float:
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"temperature must be finite and >= 0, got {v}")
        return v

    @field_validator("seed")
    @classmethod
    def _seed(cls, v: int | None) -> int | None:
        if v is not None and not 0 <= v < SEED_LIMIT:
            raise ValueError(f"seed must be in [0, {SEED_LIMIT}) or None, got {v}")
        return v

    @field_validator("top_k", "penalty_last_n")
    @classmethod
    def _non_negative(cls, v: int, info: Any) -> int:
        if v < 0:
            raise ValueError(f"{info.field_name} must be >= 0, got {v}")
        return v

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, v: float) -> float:
        if not 0 < v <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {v}")
        return v

    @field_validator("min_p")
    @classmethod
    def _min_p(cls, v: float) -> float:
        if not 0 <= v < 1:
            raise ValueError(f"min_p must be in [0, 1), got {v}")
        return v

    @field_validator("repeat_penalty")
    @classmethod
    def _repeat_penalty(cls, v: float) -> float:
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"repeat_penalty must be finite and > 0 (1 = off), got {v}")
        return v

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _finite(cls, v: float, info: Any) -> float:
        if not math.isfinite(v):
            raise ValueError(f"{info.field_name} must be finite (0 = off), got {v}")
        return v

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, v: int) -> int:
        if not 0 <= v <= TOP_LOGPROBS_LIMIT:
            raise ValueError(f"top_logprobs must be in [0, {TOP_LOGPROBS_LIMIT}], got {v}")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[int, float] | None) -> dict[int, float] | None:
        for token, bias in (v or {}).items():
            if token < 0:
                raise ValueError(f"logit_bias: token id {token} must be >= 0")
            if not math.isfinite(bias) or not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
                raise ValueError(f"logit_bias[{token}] must be in [-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}], "
                                 f"got {bias}")
        return v or None

    @field_validator("grammar")
    @classmethod
    def _grammar(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("grammar must be GBNF text or None, got an empty string")
        return v

    @model_validator(mode="after")
    def _one_grammar(self) -> SamplingParams:
        if self.grammar is not None and self.json_schema is not None:
            raise ValueError("grammar and json_schema are both set; give one of them")
        return self

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs or self.top_logprobs > 0

    @property
    def needs_grammar(self) -> bool:
        return self.grammar is not None or self.json_schema is not None

    @property
    def penalized(self) -> bool:
        return self.penalty_last_n > 0 and (
            self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0)

    @property
    def filtered(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0


class Sampler(Protocol):
    def prime(self, recent_tokens: Sequence[int]) -> None: ...

    def sample(self, logits: npt.NDArray[np.floating[Any]]) -> int: ...

    def accept(self, token: int) -> None: ...

    def logprob(self, logits: npt.NDArray[np.floating[Any]], token: int) -> float: ...

    def close(self) -> None: ...


def log_softmax_at(logits: npt.NDArray[np.floating[Any]], token: int) -> float:
    z = np.asarray(logits, dtype=np.float64)
    if not 0 <= token < z.shape[-1]:
        raise ValueError(f"token {token} is outside the {z.shape[-1]} logits")
    top = float(z.max())
    return float(z[token] - top - np.log(np.exp(z - top).sum()))


def top_log_softmax(logits: npt.NDArray[np.floating[Any]], k: int) -> list[tuple[int, float]]:
    """The ``k`` most likely tokens of ``logits`` and their log-probabilities, most likely first
    (equal ones by token id)."""
    z = np.asarray(logits, dtype=np.float64)
    k = max(0, min(int(k), z.shape[-1]))
    if k == 0:
        return []
    top = float(z.max())
    norm = top + float(np.log(np.exp(z - top).sum()))
    ids = np.argpartition(-z, k - 1)[:k]
    ids = ids[np.lexsort((ids, -z[ids]))]
    return [(int(i), float(z[i] - norm)) for i in ids]


def biased(logits: npt.NDArray[np.floating[Any]], bias: dict[int, float] | None) -> npt.NDArray[np.floating[Any]]:
    """``logits`` with ``bias`` added (a copy; ``logits`` itself where there is none). A token id
    outside the logits is a ``TokenIdError`` naming it."""
    if not bias:
        return logits
    out = np.array(logits)
    check_bias(bias, out.shape[-1])
    for token, b in bias.items():
        out[token] += b
    return out


def check_bias(bias: dict[int, float] | None, n_vocab: int) -> None:
    """Every token id of ``bias`` is in ``[0, n_vocab)`` (else a ``TokenIdError`` naming it)."""
    for token in bias or {}:
        if not 0 <= token < n_vocab:
            raise TokenIdError(f"logit_bias: token id {token} is outside the vocabulary [0, {n_vocab})")


class TokenSampler:
    def __init__(self, temperature: float = 0.0, seed: int | None = None, params: SamplingParams | None = None) -> None:
        if params is None:
            params = SamplingParams(temperature=temperature, seed=seed)
        if params.needs_grammar:
            raise CapabilityError("the numpy sampler cannot follow a grammar or JSON schema")
        self.params = params
        self.temperature = float(params.temperature)
        self.seed = params.seed
        self._rng = np.random.default_rng(params.seed)
        self._recent: deque[int] = deque(maxlen=params.penalty_last_n)

    def prime(self, recent_tokens: Sequence[int]) -> None:
        self._recent.clear()
        if self.params.penalty_last_n:
            self._recent.extend(int(t) for t in recent_tokens[-self.params.penalty_last_n:])

    def accept(self, token: int) -> None:
        self._recent.append(int(token))

    def logprob(self, logits: npt.NDArray[np.floating[Any]], token: int) -> float:
        return log_softmax_at(logits, token)

    def close(self) -> None:
        return None

    def sample(self, logits: npt.NDArray[np.floating[Any]]) -> int:
        p = self.params
        logits = biased(logits, p.logit_bias)
        if p.penalized or p.filtered:
            logits = self._filtered(np.array(logits, dtype=np.float64))
        if self.temperature == 0.0:
            return int(np.argmax(logits))
        z = np.asarray(logits, dtype=np.float64) / self.temperature
        z -= z.max()
        probs = np.exp(z)
        cdf = np.cumsum(probs)
        # searchsorted on the CDF: one uniform draw per token, stable across numpy versions
        return int(min(np.searchsorted(cdf, self._rng.random() * cdf[-1], side="right"), len(cdf) - 1))

    def _filtered(self, z: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Penalties, then top-k, top-p and min-p as llama.cpp applies them (on the penalized logits,
        before the temperature); a token filtered out gets -inf."""
        p = self.params
        if p.penalized and self._recent:
            counts = Counter(self._recent)
            ids = np.fromiter(counts, dtype=np.int64, count=len(counts))
            ids = ids[(ids >= 0) & (ids < z.shape[0])]
            n = np.asarray([counts[int(i)] for i in ids], dtype=np.float64)
            hit = z[ids]
            hit = np.where(hit <= 0, hit * p.repeat_penalty, hit / p.repeat_penalty)
            z[ids] = hit - n * p.frequency_penalty - p.presence_penalty
        if p.top_k and p.top_k < z.shape[0]:
            cut = np.partition(z, -p.top_k)[-p.top_k]
            z[z < cut] = -np.inf
        if p.top_p < 1.0 or p.min_p > 0.0:
            order = np.argsort(-z, kind="stable")
            probs = np.exp(z[order] - z[order[0]])
            probs /= probs.sum()
            keep = np.ones(z.shape[0], dtype=bool)
            if p.top_p < 1.0:
                last = int(np.searchsorted(np.cumsum(probs), p.top_p))  # the first index reaching p
                keep[last + 1:] = False
            if p.min_p > 0.0:
                keep &= probs >= p.min_p * probs[0]
            keep[0] = True
            z[order[~keep]] = -np.inf
        return z
