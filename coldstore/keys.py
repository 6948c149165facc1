"""Block keys and the validation that makes them safe to use as paths.

Primitives:
- ``MAX_SESSION_ID_LEN`` (128) and ``MAX_FINGERPRINT_LEN`` (128).
- ``validate_session_id(session_id) -> str``: ASCII letters, digits, ``.``, ``_``, ``-``; not starting
  with ``.`` (so never ``.``, ``..`` or a hidden name), at most 128 characters. Raises
  ``InvalidSessionIdError`` (also a ``ValueError``) naming the value and the rule it breaks.
- ``validate_fingerprint(fingerprint) -> str``: letters, digits, ``_``, ``-``; 1..128 characters.
- ``BlockKey(session_id, token_range, fingerprint)``: a validated, hashable, orderable key;
  ``BlockKey.of(block)`` is the key of a ``KVBlock``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvres.policy.ranges import Range

from .errors import InvalidKeyError, InvalidSessionIdError

if TYPE_CHECKING:
    from .block import KVBlock

MAX_SESSION_ID_LEN = 128
MAX_FINGERPRINT_LEN = 128

_SESSION_ID_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
_FINGERPRINT_RE = re.compile(r"[A-Za-z0-9_-]+")


def validate_session_id(session_id: object) -> str:
    """Return ``session_id`` if it is safe as one path component, else raise InvalidSessionIdError."""
    if not isinstance(session_id, str):
        raise InvalidSessionIdError(
            f"session id must be a str, got {type(session_id).__name__} {session_id!r}"
        )
    if not session_id:
        raise InvalidSessionIdError("session id must not be empty")
    if len(session_id) > MAX_SESSION_ID_LEN:
        raise InvalidSessionIdError(
            f"session id {session_id[:32]!r}... is {len(session_id)} characters long; "
            f"the limit is {MAX_SESSION_ID_LEN}"
        )
    if _SESSION_ID_RE.fullmatch(session_id) is None:
        raise InvalidSessionIdError(
            f"session id {session_id!r} is not allowed: use ASCII letters, digits, '.', '_' and '-' "
            "only, not starting with '.' (no path separators, no traversal)"
        )
    return session_id


def validate_fingerprint(fingerprint: object) -> str:
    """Return ``fingerprint`` if it is safe inside a file name, else raise InvalidKeyError."""
    if not isinstance(fingerprint, str):
        raise InvalidKeyError(
            f"fingerprint must be a str, got {type(fingerprint).__name__} {fingerprint!r}"
        )
    if not 0 < len(fingerprint) <= MAX_FINGERPRINT_LEN:
        raise InvalidKeyError(
            f"fingerprint {fingerprint[:32]!r} has {len(fingerprint)} characters; "
            f"it must have 1..{MAX_FINGERPRINT_LEN}"
        )
    if _FINGERPRINT_RE.fullmatch(fingerprint) is None:
        raise InvalidKeyError(
            f"fingerprint {fingerprint!r} is not allowed: use ASCII letters, digits, '_' and '-' only"
        )
    return fingerprint


@dataclass(frozen=True, order=True)
class BlockKey:
    """Where a block lives: (session id, token range, fingerprint), all validated."""

    session_id: str
    token_range: Range
    fingerprint: str
    if TYPE_CHECKING:  # set by __post_init__, not a field (pickles, compares and prints without it)
        _flat: tuple[str, int, int, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_session_id(self.session_id)
        validate_fingerprint(self.fingerprint)
        if not isinstance(self.token_range, Range):
            raise InvalidKeyError(
                f"token_range must be a kvres.policy.ranges.Range, got {self.token_range!r}"
            )
        object.__setattr__(self, "_flat", self._flatten())

    # Keys are looked up by the hundred per recall (stage, RAM tier): hash and compare one flat
    # tuple, made once, instead of the generated methods' nested Range calls.
    def _flatten(self) -> tuple[str, int, int, str]:
        return (self.session_id, self.token_range.start, self.token_range.end, self.fingerprint)

    def __hash__(self) -> int:
        return hash(self._flat)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockKey):
            return NotImplemented
        return self is other or self._flat == other._flat

    def __getstate__(self) -> dict[str, object]:
        return {"session_id": self.session_id, "token_range": self.token_range, "fingerprint": self.fingerprint}

    def __setstate__(self, state: dict[str, object]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_flat", self._flatten())

    @classmethod
    def of(cls, block: KVBlock) -> BlockKey:
        return cls(block.session_id, block.token_range, block.fingerprint)

    def __str__(self) -> str:
        return f"{self.session_id}{self.token_range}@{self.fingerprint}"
