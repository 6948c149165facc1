"""What every engine's sessions do at the context limit, checked the same way on each.

Primitives: ``limit_tokens(n, start)`` (distinct prompt tokens), ``check_the_limit(session,
backend, budget) -> ContextLengthError``: a session holding 1,900 tokens is refused 150 more
(nothing appended, also as a generate's prompt), generates up to the budget and no further, and
a stream after a rollback stops there too; the first refusal is returned for more checks.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvres.policy import ContextLengthError


def limit_tokens(n: int, start: int = 0) -> list[int]:
    return [3 + (start + i) % 400 for i in range(n)]


def check_the_limit(s: Any, backend: str, budget: int) -> ContextLengthError:
    s.append(limit_tokens(1900))
    with pytest.raises(ContextLengthError, match=r"holds 1900 tokens and the call brings 150 more: 2050 is past "
                                                 rf"the {budget} tokens one session can hold on backend '{backend}' "
                                                 rf"\(kv_budget_tokens={budget}\)") as refused:
        s.append(limit_tokens(150, 1900))
    with pytest.raises(ContextLengthError, match="2050 is past"):  # a prompt given with the generate
        s.generate(5, prompt=limit_tokens(150, 1900))
    assert s.tokens() == limit_tokens(1900)  # nothing of either was appended
    reply = s.generate(300, ignore_eos=True)
    assert reply.finish_reason == "length" and len(reply) == budget - 1900
    assert s.tokens() == limit_tokens(1900) + list(reply)
    nothing = s.generate(10, ignore_eos=True)  # full: it ends at once, as at max_tokens
    assert list(nothing) == [] and nothing.finish_reason == "length" and len(s.tokens()) == budget
    s.rollback(30)
    stream = s.stream(100, ignore_eos=True)
    assert len(list(stream)) == 30 and stream.finish_reason == "length"
    assert len(s.tokens()) == budget
    return refused.value
