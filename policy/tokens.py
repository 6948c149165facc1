"""Token ids as the engines take them.

Primitives:
- ``token_ids(tokens, vocab_size=None, what="token ids") -> list[int]``: the ids as Python ints,
  or ``TokenIdError`` naming the first bad value and the limit. Python and numpy integers are
  accepted; bools, floats, strings and ids outside ``[0, vocab_size)`` are refused (a float that
  happens to be whole is still a float: silently truncating it would change the session's text).
- ``TokenIdError``: a ``KvresError`` and a ``ValueError``.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable

from .errors import KvresError


class TokenIdError(KvresError, ValueError):
    """A token id that is not an integer, or outside the model's vocabulary."""


def token_ids(tokens: Iterable[object], vocab_size: int | None = None, what: str = "token ids") -> list[int]:
    if isinstance(tokens, (str, bytes)):
        raise TokenIdError(f"{what} must be a sequence of integers, got text {tokens[:40]!r}")
    try:
        values = list(tokens)
    except TypeError:
        raise TokenIdError(f"{what} must be a sequence of integers, got {type(tokens).__name__} {tokens!r}") from None
    if not values or set(map(type, values)) == {int}:  # the common case, checked in bulk (in C)
        ints: list[int] = values  # type: ignore[assignment]
        if not ints or (min(ints) >= 0 and (vocab_size is None or max(ints) < vocab_size)):
            return ints
    return _checked(values, vocab_size, what)


def _checked(tokens: list[object], vocab_size: int | None, what: str) -> list[int]:
    out: list[int] = []
    for i, t in enumerate(tokens):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise TokenIdError(f"{what}[{i}] = {t!r} ({type(t).__name__}) is not an integer token id")
        value = int(t)
        if value < 0 or (vocab_size is not None and value >= vocab_size):
            limit = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
            raise TokenIdError(f"{what}[{i}] = {value} is outside the vocabulary {limit}")
        out.append(value)
    return out
