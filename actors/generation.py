"""What a generate call asks for and what it answers: the turn's bounds, its sampling, why it ended.

Primitives:
- ``GenerationRequest(max_tokens, sampling=SamplingParams(), stop=(), stop_token_ids=(),
  ignore_eos=False)``: validated when built (``max_tokens`` an int >= 0, bools refused; stop
  strings non-empty; stop ids >= 0), a ``pydantic.ValidationError`` naming the field otherwise.
- ``Generation``: the tokens generated (a ``list[int]``), with ``finish_reason`` ("eos": an
  end-of-generation token; "stop": a stop id or stop string; "length": ``max_tokens``;
  "cancelled": its stream was left), ``stop`` (the stop id or string that ended it), ``text`` (the
  reply as text, cut before a stop string; None where the engine has no detokenizer) and
  ``logprobs`` (of each chosen token, when asked), and for a chat turn ``prompt_tokens`` (what its
  messages appended) and ``prefix_break`` (where its rendered conversation first left what the
  session held: ``kvres.actors.host.prefix_break``; None where it kept all of it).
- ``StopRule(eog, stop_ids, stop_strings)``: ``check(produced, detokenize)`` after each token.

The stop rule, as the docs state it: every token up to and including the one that completes a stop
string (or is an end-of-generation or stop token) is committed to the session's log, so its KV and
its log agree; nothing after it is generated. ``text`` leaves the stop string and anything after
it out, as OpenAI's API does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator

from .sampling import SamplingParams

FinishReason = Literal["eos", "stop", "length", "cancelled"]
MAX_STOP_STRINGS = 16


class GenerationRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: StrictInt = Field(ge=0)
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[StrictInt, ...] = ()
    ignore_eos: StrictBool = False

    @field_validator("stop", mode="before")
    @classmethod
    def _one_or_many(cls, v: object) -> object:
        return (v,) if isinstance(v, str) else v

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(v) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(v)}")
        if any(not s for s in v):
            raise ValueError("a stop string must not be empty")
        return v

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_ids(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        bad = [t for t in v if t < 0]
        if bad:
            raise ValueError(f"stop token ids must be >= 0, got {bad[0]}")
        return v


class Generation(list[int]):
    """The tokens of one generate call, and why it ended."""

    def __init__(self, tokens: Sequence[int] = (), finish_reason: FinishReason = "length",
                 stop: str | int | None = None, text: str | None = None,
                 logprobs: list[float] | None = None, prompt_tokens: int | None = None,
                 length: int | None = None, prefix_break: dict[str, Any] | None = None,
                 top_logprobs: list[list[tuple[int, float]]] | None = None) -> None:
        super().__init__(int(t) for t in tokens)
        self.finish_reason: FinishReason = finish_reason
        self.stop = stop
        self.text = text
        self.logprobs = logprobs
        self.prompt_tokens = prompt_tokens  # a chat turn: the tokens its messages appended
        self.length = length  # the session's log length when the call committed (None: not known)
        self.prefix_break = prefix_break  # a chat turn: where its conversation first left the session's log
        self.top_logprobs = top_logprobs  # per token: the step's most likely (token, logprob), when asked

    def __reduce__(self) -> tuple[object, ...]:
        return (Generation, (list(self), self.finish_reason, self.stop, self.text, self.logprobs, self.prompt_tokens,
                             self.length, self.prefix_break, self.top_logprobs))

    def __repr__(self) -> str:
        return f"Generation({list(self)!r}, finish_reason={self.finish_reason!r}, stop={self.stop!r})"


@dataclass(frozen=True)
class StopRule:
    eog: frozenset[int] = frozenset()
    stop_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()

    @classmethod
    def of(cls, request: GenerationRequest, eog: frozenset[int]) -> StopRule:
        return cls(frozenset() if request.ignore_eos else eog, frozenset(request.stop_token_ids), request.stop)

    def check(
        self, produced: Sequence[int], detokenize: Callable[[Sequence[int]], str],
    ) -> tuple[FinishReason, str | int | None] | None:
        """Why generation ends after the last token of ``produced``, or None."""
        token = produced[-1]
        if token in self.stop_ids:
            return "stop", token
        if token in self.eog:
            return "eos", None
        if self.stop_strings:
            # a stop string of n characters spans at most 4n tokens (byte-fallback pieces) plus
            # the token that completes it
            tail = 4 * max(len(s) for s in self.stop_strings) + 1
            text = detokenize(produced[-tail:])
            for s in self.stop_strings:
                if s in text:
                    return "stop", s
        return None


def reply_text(produced: Sequence[int], stop: str | int | None, detokenize: Callable[[Sequence[int]], str],
               before: int | None = None) -> str:
    """The reply as text: control tokens left out, cut before a stop string. ``before``: the log's
    token before the reply; decoded after it, the reply keeps the leading space of its first token
    (llama.cpp drops it from the first token it decodes)."""
    text = detokenize(produced)
    if before is not None and produced:
        head = detokenize([before])
        whole = detokenize([before, *produced])
        if whole.startswith(head):
            text = whole[len(head):]
    if isinstance(stop, str):
        cut = text.find(stop)
        if cut >= 0:
            text = text[:cut]
    return text
