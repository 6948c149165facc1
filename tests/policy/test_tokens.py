"""Token ids: integers in range pass, everything else is a typed error naming the value."""

from __future__ import annotations

import numpy as np
import pytest

from kvres.policy import KvresError
from kvres.policy.tokens import TokenIdError, token_ids


def test_python_and_numpy_integers_pass() -> None:
    assert token_ids([1, np.int64(2), np.uint16(3)], vocab_size=4) == [1, 2, 3]
    assert all(type(t) is int for t in token_ids(np.arange(5)))


@pytest.mark.parametrize(("bad", "match"), [
    ([1, 2.0], r"token ids\[1\] = 2.0 \(float\) is not an integer"),
    ([True], r"token ids\[0\] = True \(bool\)"),
    (["7"], r"token ids\[0\] = '7' \(str\)"),
    ([np.float32(1)], r"float32"),
    ([3, -1], r"token ids\[1\] = -1 is outside the vocabulary \[0, 9\)"),
    ([0, 9], r"token ids\[1\] = 9 is outside the vocabulary \[0, 9\)"),
])
def test_bad_ids_are_refused_by_value(bad: list[object], match: str) -> None:
    with pytest.raises(TokenIdError, match=match) as info:
        token_ids(bad, vocab_size=9)
    assert isinstance(info.value, KvresError) and isinstance(info.value, ValueError)


def test_text_is_not_a_token_sequence() -> None:
    with pytest.raises(TokenIdError, match="got text"):
        token_ids("hello")
