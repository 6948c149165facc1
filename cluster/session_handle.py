"""A session as a driver holds it: one Ray call per operation on the backend that serves it.

Primitives:
- ``Session(manager, session_id, backend)``: ``append(tokens or text)``, ``generate``, ``stream``,
  ``suspend``, ``resume``, ``migrate(backend)``, ``stats()``, ``detokenize``, ``close()``.

Calls go through the backend's typed client (``BackendClient``); errors raised by the actors
arrive as their kvres types. Each call carries a request id, so a call repeated after a backend
died is never applied twice.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from kvres.policy.tokens import token_ids

from .backend_client import BackendClient
from .planner_client import PlannerClient


class SessionManager(Protocol):
    """What a session needs of its manager (``kvres.cluster.session.SessionManager``)."""

    def backend(self, name: str) -> BackendClient: ...

    @property
    def planner_client(self) -> PlannerClient: ...

    def migrate(self, session: Session, backend: str) -> None: ...


class Session:
    def __init__(self, manager: SessionManager, session_id: str, backend: str) -> None:
        self._manager = manager
        self.session_id = session_id
        self.backend = backend

    def __repr__(self) -> str:
        return f"Session({self.session_id!r} on {self.backend!r})"

    @property
    def _backend(self) -> BackendClient:
        return self._manager.backend(self.backend)

    def append(self, tokens_or_text: str | Sequence[int]) -> list[int]:
        """Append token ids, or text (tokenized by the backend's model); returns the token ids.
        All of them are committed or none; if the backend dies during the call it is repeated
        once it is back, and never applied twice."""
        request = uuid.uuid4().hex
        if isinstance(tokens_or_text, str):
            return self._backend.append_text(self.session_id, tokens_or_text, request)
        tokens = token_ids(tokens_or_text)
        self._backend.append(self.session_id, tokens, request)
        return tokens

    def generate(self, max_tokens: int, temperature: float = 0.0, seed: int | None = None) -> list[int]:
        """Up to ``max_tokens`` tokens, committed together (like an append)."""
        seed = _seed_for(temperature, seed)
        return self._backend.generate(self.session_id, max_tokens, temperature, seed, uuid.uuid4().hex)

    def stream(self, max_tokens: int, temperature: float = 0.0, seed: int | None = None) -> Iterator[int]:
        """Tokens as they are produced (a Ray streaming generator underneath), committed when the
        stream ends. If the backend dies midway the stream goes on from the same request once it
        is back: the same sampler and seed give the same tokens, and none is handed out twice."""
        seed = _seed_for(temperature, seed)
        return self._backend.stream(self.session_id, max_tokens, temperature, seed, uuid.uuid4().hex)

    def suspend(self) -> None:
        self._backend.suspend(self.session_id)

    def resume(self) -> int:
        """Bring the session back; returns how many tokens had to be recomputed."""
        return self._backend.resume(self.session_id)

    def migrate(self, backend: str) -> None:
        """Move to another backend (on another node where there is one); KV travels through the
        cold store, nothing is lost if the target refuses it."""
        self._manager.migrate(self, backend)

    def stats(self) -> dict[str, Any]:
        return self._backend.session_stats(self.session_id)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._backend.detokenize(tokens)

    def close(self) -> None:
        self._backend.close(self.session_id)
        self._manager.planner_client.forget(self.session_id)


def _seed_for(temperature: float, seed: int | None) -> int | None:
    """A sampled call gets a seed here when it has none, so a retry samples the same tokens."""
    if temperature > 0 and seed is None:
        return int.from_bytes(os.urandom(4), "little")
    return seed
