"""Errors of the llama.cpp backend; each is a ``kvres.policy.KvresError``.

Primitives:
- ``ContextFullError``: the engine context has no room for the tokens an operation needs
  (``needed`` and ``free`` cells say how far off it is). The session is left as it was.
- ``SessionLimitError``: every sequence id of the context is taken (more sessions than
  ``n_seq_max``).
- ``EngineError``: llama.cpp refused or failed an operation for another reason.
"""

from __future__ import annotations

from kvres.policy.errors import KvresError


class ContextFullError(KvresError, RuntimeError):
    def __init__(self, message: str, needed: int = 0, free: int = 0) -> None:
        super().__init__(message)
        self.needed = needed
        self.free = free

    def __reduce__(self) -> tuple[object, ...]:  # keep needed / free across Ray's pickling
        return (type(self), (str(self), self.needed, self.free))


class SessionLimitError(ContextFullError):
    """More sessions than the context has sequence ids for."""


class EngineError(KvresError, RuntimeError):
    """llama.cpp failed an operation (decode, state restore) for a reason other than capacity."""
