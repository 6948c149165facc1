"""The backend's operations, declared once: what a driver's client sends, the Ray shell serves and the
host carries out.

Primitives:
- ``BackendSurface[StreamT, RestoredT]``: a ``Protocol`` holding every operation the three backend
  classes share, the session id first (``fork``: the source's; ``restore``: the exported bytes,
  then the id to open them under), each parameter as the wire carries it. ``BackendHost``
  (``actors/host/backend.py``), ``BackendServer`` (``actors/ray_actors/backend_actor.py``) and
  ``BackendClient`` (``cluster/backend_client.py``) are each checked against it by mypy, in their
  own module (``make typecheck``). A class may take more than the declaration: a wider type, a
  default, or a parameter of its own after the declared ones, keyword-only or defaulted (the host's
  ``temperature`` / ``seed``, the shell's stream ``lease`` and ``chunks``, the stream's
  ``ephemeral`` / ``policy`` of a stateless turn in all three, the client's ``follow``, ``once``,
  ``retry_ok``).
- The type parameters are what differs by nature. ``StreamT``: what ``stream`` hands back (the
  host's ``TokenStream`` of a job, the shell's generator of tokens then the ``Generation``, the
  driver's ``TokenStream``). ``RestoredT``: what ``restore`` answers (the host and the shell: the
  session's id and the tokens recomputed; the driver's client: the tokens recomputed).

Not declared: what the driver sends without waiting for it (``ping``, ``stats``: the client's
``ping_ref`` / ``stats_ref``), and what only the host does for its own shell (``chat_stream``,
``close_reply``, ``load``, ``sessions``, ``token_count``, ``shutdown``).

mypy matches a protocol's parameters by position, kind and type, not by name;
``tests/test_surface.py`` checks that the four classes name every declared parameter as the
declaration does (``Session`` against ``kvres.cluster.session_surface``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from ..config import SessionPolicy
    from ..generation import Generation, GenerationRequest
    from .sessions import SuspendRecord

StreamT = TypeVar("StreamT", covariant=True)
RestoredT = TypeVar("RestoredT", covariant=True)


class BackendSurface(Protocol[StreamT, RestoredT]):
    # -- a session's lifecycle ----------------------------------------------------------------------
    def open_session(self, session_id: str, policy: SessionPolicy | None) -> None: ...

    def suspend(self, session_id: str) -> SuspendRecord | None:
        """The host hands back the record it parked; over Ray nothing comes back."""
        ...

    def resume(self, session_id: str, record: SuspendRecord | None = None) -> int: ...

    def detach(self, session_id: str) -> SuspendRecord: ...

    def close(self, session_id: str) -> None: ...

    def session_stats(self, session_id: str) -> dict[str, Any]: ...

    # -- tokens in and out --------------------------------------------------------------------------
    def append(self, session_id: str, tokens: Sequence[int], request_id: str) -> int: ...

    def append_text(self, session_id: str, text: str, request_id: str) -> list[int]: ...

    def generate(self, session_id: str, request: GenerationRequest, request_id: str,
                 prompt: list[int] | None = None) -> Generation: ...

    def stream(self, session_id: str, request: GenerationRequest, request_id: str, prompt: list[int] | None = None,
               messages: list[dict[str, Any]] | None = None) -> StreamT: ...

    def chat(self, session_id: str, messages: list[dict[str, Any]], request: GenerationRequest,
             request_id: str) -> Generation: ...

    def append_messages(self, session_id: str, messages: list[dict[str, Any]], request_id: str) -> int: ...

    def cancel(self, session_id: str, request_id: str, keep: int) -> Generation | None: ...

    def pause_for_tools(self, session_id: str) -> None: ...

    # -- a session's history ------------------------------------------------------------------------
    def tokens(self, session_id: str) -> list[int]: ...

    def truncate(self, session_id: str, length: int) -> int: ...

    def fork(self, source_id: str, new_id: str) -> None: ...

    def export(self, session_id: str) -> bytes: ...

    def restore(self, data: bytes, session_id: str) -> RestoredT: ...

    # -- the backend's model ------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str: ...
