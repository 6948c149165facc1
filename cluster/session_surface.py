"""A driver's session operations, declared once, and the backend operations each one forwards to.

Primitives:
- ``SessionSurface``: a ``Protocol`` of what a ``Session`` (``cluster/session_handle.py``) offers:
  the session-bound form of the backend's operations (no session id; friendlier arguments: text or
  token ids, sampling as keywords, a path to export to). mypy checks ``Session`` against it (in
  ``session_handle.py``).
- ``SESSION_FORWARDS``: each session operation and the backend operations
  (``kvres.actors.host.backend_surface.BackendSurface``) it reaches, through the session's client or
  its manager. ``NOT_ON_SESSION``: the backend operations no session operation reaches, and what
  calls them. ``tests/test_surface.py`` checks that the two tables cover both surfaces exactly, so
  an operation added to one surface and not to the other fails.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from kvres.actors.generation import Generation

    from .backend_client import TokenStream


class SessionSurface(Protocol):
    # -- tokens in and out --------------------------------------------------------------------------
    def append(self, tokens_or_text: str | Sequence[int]) -> list[int]: ...

    def generate(self, max_tokens: int, temperature: float = 0.0, seed: int | None = None, *,
                 stop: str | Sequence[str] = (), stop_token_ids: Sequence[int] = (), ignore_eos: bool = False,
                 prompt: Sequence[int] | None = None, **sampling: Any) -> Generation: ...

    def stream(self, max_tokens: int, temperature: float = 0.0, seed: int | None = None, *,
               stop: str | Sequence[str] = (), stop_token_ids: Sequence[int] = (), ignore_eos: bool = False,
               prompt: Sequence[int] | None = None, **sampling: Any) -> TokenStream: ...

    def chat(self, messages: Sequence[Mapping[str, Any]], max_tokens: int = 256, temperature: float = 0.0,
             seed: int | None = None, *, stop: str | Sequence[str] = (), stop_token_ids: Sequence[int] = (),
             ignore_eos: bool = False, **sampling: Any) -> Generation: ...

    def chat_stream(self, messages: Sequence[Mapping[str, Any]], max_tokens: int = 256, temperature: float = 0.0,
                    seed: int | None = None, *, stop: str | Sequence[str] = (), stop_token_ids: Sequence[int] = (),
                    ignore_eos: bool = False, **sampling: Any) -> TokenStream: ...

    def append_messages(self, messages: Sequence[Mapping[str, Any]]) -> int: ...

    # -- its history --------------------------------------------------------------------------------
    def tokens(self) -> list[int]: ...

    def text(self) -> str: ...

    def truncate(self, length: int) -> int: ...

    def rollback(self, count: int) -> int: ...

    def fork(self, new_id: str | None = None) -> SessionSurface: ...

    def export(self, path: str | os.PathLike[str]) -> Path: ...

    # -- where it lives -----------------------------------------------------------------------------
    def suspend(self) -> None: ...

    def pause_for_tools(self) -> None: ...

    def resume(self) -> int: ...

    def migrate(self, backend: str) -> None: ...

    def stats(self) -> dict[str, Any]: ...

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str: ...

    def close(self) -> None: ...


SESSION_FORWARDS: dict[str, tuple[str, ...]] = {
    "append": ("append", "append_text"),  # token ids, or text tokenized by the backend
    "generate": ("generate",),
    "stream": ("stream",),
    "chat": ("chat",),
    "chat_stream": ("stream",),  # the turn's messages go with the stream
    "append_messages": ("append_messages",),
    "tokens": ("tokens",),
    "text": ("tokens", "detokenize"),
    "truncate": ("truncate",),
    "rollback": ("tokens", "truncate"),
    "fork": ("fork",),  # through SessionManager.fork, which registers the new session
    "export": ("export",),
    "suspend": ("suspend",),
    "pause_for_tools": ("pause_for_tools",),
    "resume": ("resume",),
    "migrate": ("detach", "resume"),  # through SessionManager.migrate: off the source, onto the target
    "stats": ("session_stats",),
    "detokenize": ("detokenize",),
    "close": ("close",),
}

NOT_ON_SESSION: dict[str, str] = {
    "open_session": "SessionManager.open_session (there is no session before it)",
    "restore": "SessionManager.restore (a session from an exported file)",
    "cancel": "TokenStream, when its consumer leaves it early",
    "tokenize": "BackendClient.tokenize: a backend's model, no session (the demo)",
}
