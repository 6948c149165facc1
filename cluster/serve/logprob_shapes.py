"""A reply's log-probabilities in OpenAI's shapes.

Primitives:
- ``token_logprobs(outcome) -> list[dict] | None``: chat completions' ``logprobs.content`` and
  Responses' ``output_text.logprobs``: per token ``{token, logprob, bytes, top_logprobs}``, where
  ``top_logprobs`` holds the step's most likely tokens, most likely first, each ``{token, logprob,
  bytes}`` (empty where none were asked); None where log-probabilities were not asked.
- ``completion_logprobs(outcome) -> dict | None``: ``/v1/completions``' ``{tokens, token_logprobs,
  top_logprobs, text_offset}``, ``top_logprobs`` a ``{text: logprob}`` per token (None where
  ``logprobs`` was 0).
"""

from __future__ import annotations

from typing import Any

from .turns import TurnOutcome


def _entry(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def token_logprobs(outcome: TurnOutcome) -> list[dict[str, Any]] | None:
    if outcome.logprobs is None or outcome.token_texts is None:
        return None
    tops = outcome.top_logprobs or [[] for _ in outcome.logprobs]
    return [{**_entry(text, lp), "top_logprobs": [_entry(t, alt) for t, alt in top]}
            for text, lp, top in zip(outcome.token_texts, outcome.logprobs, tops, strict=False)]


def completion_logprobs(outcome: TurnOutcome) -> dict[str, Any] | None:
    if outcome.logprobs is None or outcome.token_texts is None:
        return None
    offsets, at = [], 0
    for text in outcome.token_texts:
        offsets.append(at)
        at += len(text)
    top: list[dict[str, float]] | None = None
    if outcome.top_logprobs is not None:
        top = []
        for step in outcome.top_logprobs:
            by_text: dict[str, float] = {}
            for text, lp in step:  # most likely first: two tokens of one text keep the likelier
                by_text.setdefault(text, lp)
            top.append(by_text)
    return {"tokens": outcome.token_texts, "token_logprobs": outcome.logprobs, "top_logprobs": top,
            "text_offset": offsets}
