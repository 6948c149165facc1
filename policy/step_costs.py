"""What an engine step costs, learnt from the steps run, and whether one more prompt should share one.

Primitives:
- ``StepCosts(memory=64)``: ``observe(seconds, prompt_tokens, rows)`` after each step (its engine
  time, the prompt tokens it fed and its one-token rows, the decodes); ``fixed_s(rows)`` (what a
  step of ``rows`` decodes and no prompt costs: a pass over the weights and a row each, fitted to
  the recent steps without prompt tokens), ``per_token_s`` (what a prompt token adds beside them);
  None until measured; ``joins(finishing, tokens, rows)``.

Why: every prompt that ends in a step gets its first token when that step ends. A prompt of ``n``
tokens that joins a step in which ``k`` other prompts end delays each of them by ``n *
per_token_s``; left to the next step it waits that step's fixed cost more. For the sum of their
times to first token it joins when ``k * n * per_token_s < fixed_s(rows)``: on a CPU, where a
prompt token costs about the same batched or not, a burst of 35-token turns beside a few decodes
goes one prompt a step (each first token comes after its own prefill, not after all of theirs); on
a GPU, where the pass over the weights is most of a small step, prompts share. A decode never
waits, and the first prompt of a step always runs. Until both costs are measured every prompt
joins (the step's token limit is the only one).
"""

from __future__ import annotations

MIN_PROMPT_TOKENS = 8  # a step with fewer prompt tokens says little of what one costs
PROMPT_RATE = 0.25  # how fast the per-token cost follows new prompt steps (rarer than decode steps)


class StepCosts:
    def __init__(self, memory: int = 64) -> None:
        if memory < 2:
            raise ValueError(f"memory={memory} must be at least 2 steps")
        self._keep = 1.0 - 1.0 / memory  # older steps weigh less, so the fit follows the load
        self._sums = [0.0] * 5  # weight, rows, seconds, rows^2, rows*seconds (steps without prompts)
        self.per_token_s: float | None = None

    def fixed_s(self, rows: int) -> float | None:
        w, x, y, xx, xy = self._sums
        if w <= 0.0:
            return None
        spread = w * xx - x * x
        if spread <= 1e-9 * max(1.0, w * xx):  # every step had as many rows: their mean
            return y / w
        row_s = max(0.0, (w * xy - x * y) / spread)
        pass_s = max(0.0, (y - row_s * x) / w)
        return pass_s + row_s * rows

    def observe(self, seconds: float, prompt_tokens: int, rows: int) -> None:
        if seconds < 0 or prompt_tokens < 0 or rows < 0:
            raise ValueError(f"a step of {seconds} s, {prompt_tokens} prompt tokens and {rows} rows cannot be")
        if prompt_tokens == 0:
            self._sums = [self._keep * s for s in self._sums]
            for i, v in enumerate((1.0, rows, seconds, rows * rows, rows * seconds)):
                self._sums[i] += v
            return
        fixed = self.fixed_s(rows)
        if prompt_tokens >= MIN_PROMPT_TOKENS and fixed is not None:
            sample = max(0.0, seconds - fixed) / prompt_tokens
            old = self.per_token_s
            self.per_token_s = sample if old is None else old + PROMPT_RATE * (sample - old)

    def joins(self, finishing: int, tokens: int, rows: int) -> bool:
        """Whether a prompt chunk of ``tokens`` joins a step of ``rows`` decodes in which
        ``finishing`` prompts end."""
        fixed = self.fixed_s(rows)
        if finishing <= 0 or fixed is None or self.per_token_s is None:
            return True
        return finishing * tokens * self.per_token_s < fixed
