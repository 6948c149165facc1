"""Sampling with llama.cpp's own samplers, on logits the host keeps as numpy.

Primitives:
- ``LlamaSampler(model, params)``: a ``kvres.actors.sampling.Sampler`` over one llama.cpp
  sampler chain built from ``SamplingParams``: grammar (GBNF, or a JSON schema turned into GBNF by
  llama-cpp-python's own converter, ``llama_cpp.llama_grammar.json_schema_to_gbnf``, its string
  characters narrowed to what JSON allows), penalties
  (repeat / frequency / presence over the last ``penalty_last_n`` tokens), then top-k, top-p,
  min-p, temperature and a seeded draw (``dist``), or ``greedy`` at temperature 0. ``sample``
  adds the params' ``logit_bias`` first (a token id outside the vocabulary is refused when the
  sampler is made: ``TokenIdError``), then copies the logits into a candidate array and applies the chain (greedy under a grammar alone
  takes the argmax when the grammar allows it, as the chain would, asking the grammar of that
  token only); ``prime`` feeds the log's last
  tokens to the penalties only (a prompt is not grammar text); ``accept`` feeds both, and refuses
  (``ValueError``) a token the grammar does not allow, which llama.cpp would abort on. A grammar
  llama.cpp refuses raises ``GrammarError`` (a ``ValueError``) with what its parser printed (on
  stderr, captured while the refusal is repeated), as does a JSON schema its converter cannot
  express. The chain is freed by ``close()`` or when the sampler is collected.
- ``to_gbnf(params) -> str | None``: the grammar text ``params`` ask for.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kvres.actors.sampling import GrammarError, SamplingParams, biased, check_bias, log_softmax_at

from .engine import TOKEN_DATA, LlamaModel, sampler_accept, sampler_free, sampler_reset, sampler_sample

DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: llama.cpp picks a random seed
_LAX_CHAR = r'char ::= [^"\\] |'
_JSON_CHAR = r'char ::= [^"\\\x7F\x00-\x1F] |'


def to_gbnf(params: SamplingParams) -> str | None:
    if params.json_schema is None:
        return params.grammar
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        gbnf = str(json_schema_to_gbnf(json.dumps(params.json_schema)))
    except Exception as exc:  # the converter raises assorted errors on schemas it cannot express
        raise GrammarError(f"json_schema cannot be turned into a grammar: {exc}") from exc
    # 0.3.36's converter lets raw control characters into strings, which JSON forbids (llama.cpp's
    # own converter excludes them the same way)
    return gbnf.replace(_LAX_CHAR, _JSON_CHAR)


def _grammar_problem(model: LlamaModel, part: tuple[Any, ...]) -> str:
    """What llama.cpp says about a grammar it refuses: its parser prints the reason to stderr, not
    through its log, so the refusal is repeated with file descriptor 2 captured."""
    with tempfile.TemporaryFile() as out:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            sampler_free(model.sampler_chain([part]))
        except ValueError as exc:
            refusal = str(exc)
        else:
            refusal = ""
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        said = " ".join(out.read().decode("utf-8", "replace").split())
    return said or refusal or "llama.cpp accepted it on a second try"


class LlamaSampler:
    def __init__(self, model: LlamaModel, params: SamplingParams) -> None:
        self.params = params
        self.n_vocab = model.n_vocab
        check_bias(params.logit_bias, self.n_vocab)  # refused before the call runs
        parts: list[tuple[Any, ...]] = []
        gbnf = to_gbnf(params)
        if gbnf is not None:
            parts.append(("grammar", gbnf.encode("utf-8"), b"root"))
        self._grammar = 0 if gbnf is not None else None
        # greedy under a grammar and nothing else: the argmax is the chain's choice whenever the
        # grammar allows it, so the grammar is asked of that one token, not of the whole vocabulary
        # (which costs ~10 ms per token at a 32k vocabulary)
        self._argmax_first = gbnf is not None and params.temperature == 0.0 and not params.penalized
        # greedy and nothing else: the chain's choice is the argmax (its first of equal maxima), which
        # numpy finds without filling the chain's 32k-entry candidate array each token
        self._argmax_only = gbnf is None and params.temperature == 0.0 and not params.penalized
        self._penalties = len(parts) if params.penalized else None
        if params.penalized:
            parts.append(("penalties", model.n_vocab, params.penalty_last_n, params.repeat_penalty,
                          params.frequency_penalty, params.presence_penalty))
        if params.temperature == 0.0:
            parts.append(("greedy",))
        else:
            if params.top_k:
                parts.append(("top_k", params.top_k))
            if params.top_p < 1.0:
                parts.append(("top_p", params.top_p, 1))
            if params.min_p > 0.0:
                parts.append(("min_p", params.min_p, 1))
            parts += [("temp", params.temperature), ("dist", DEFAULT_SEED if params.seed is None else params.seed)]
        try:
            self._chain = model.sampler_chain(parts)
        except ValueError as exc:
            if gbnf is None or "grammar" not in str(exc):
                raise
            raise GrammarError(f"the grammar is not valid GBNF: {_grammar_problem(model, parts[0])}") from None
        self._free = weakref.finalize(self, sampler_free, self._chain)
        self._data = np.zeros(model.n_vocab, dtype=TOKEN_DATA)
        self._one = np.zeros(1, dtype=TOKEN_DATA)
        self._sampled: int | None = None  # the token sample() chose under the grammar's current state

    def prime(self, recent_tokens: Sequence[int]) -> None:
        if self._penalties is None:
            return
        self._check_open()
        sampler_reset(self._chain, self._penalties)
        for token in recent_tokens[-self.params.penalty_last_n:]:
            sampler_accept(self._chain, int(token), self._penalties)

    def sample(self, logits: npt.NDArray[np.floating[Any]]) -> int:
        self._check_open()
        if logits.shape != (self.n_vocab,):
            raise ValueError(f"expected {self.n_vocab} logits, got shape {logits.shape}")
        logits = biased(logits, self.params.logit_bias)
        if self._argmax_first or self._argmax_only:
            best = int(np.argmax(logits))  # the first of equal maxima, as llama.cpp's greedy takes
            if np.isfinite(logits[best]) and (self._argmax_only or self._allows(best)):
                self._sampled = best
                return best
        data = self._data
        data["id"] = np.arange(self.n_vocab, dtype=np.int32)
        data["logit"] = logits
        data["p"] = 0.0
        token = sampler_sample(self._chain, data)
        if token < 0:
            raise ValueError("no token is left to sample: the grammar and filters rule every candidate out")
        self._sampled = token
        return token

    def accept(self, token: int) -> None:
        self._check_open()
        token = int(token)
        if not 0 <= token < self.n_vocab:
            raise ValueError(f"token {token} is outside the vocabulary [0, {self.n_vocab})")
        sampled, self._sampled = self._sampled, None
        # the token sample() just chose was chosen under the grammar: it is not asked a second time
        if self._grammar is not None and token != sampled and not self._allows(token):
            raise ValueError(f"token {token} is not allowed by the grammar here")
        sampler_accept(self._chain, token)

    def _allows(self, token: int) -> bool:
        """The grammar allows ``token`` next (it is asked of that token alone; its state stays)."""
        assert self._grammar is not None
        self._one[0] = (token, 0.0, 0.0)
        sampler_sample(self._chain, self._one, self._grammar)
        return bool(np.isfinite(self._one["logit"][0]))

    def logprob(self, logits: npt.NDArray[np.floating[Any]], token: int) -> float:
        return log_softmax_at(logits, token)

    def close(self) -> None:
        self._free()

    def _check_open(self) -> None:
        if not self._free.alive:
            raise ValueError("the sampler has been closed")
