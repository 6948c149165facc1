"""A driver's typed client of one backend actor: one method per actor method, each one Ray call.

Primitives:
- ``BackendClient(name, handle, revive)``: ``handle()`` is the actor's handle now (looked up again
  after a death: a backend created anew has a new one), ``revive()`` waits until the actor answers
  again (or raises ``BackendLostError``). Calls that wait for their answer: ``open_session``,
  ``append``, ``append_text``, ``generate``, ``stream`` (an iterator of tokens), ``suspend``,
  ``resume``, ``detach``, ``close``, ``session_stats``, ``tokenize``, ``detokenize``. Calls sent
  without waiting, returning the ``ObjectRef``: ``ping_ref``, ``stats_ref``.

A call that meets the backend's death waits for it to come back and is sent once more
(``remote_calls.call``; every call that changes a session carries a request id or is safe to
repeat); errors the backend raises arrive as their kvres types, a second death as
``BackendLostError``. ``once=True`` (``resume`` of a handed-over record, ``detach``) sends a single
attempt and raises what it meets, an actor death included: the caller (a migration) decides what
that means.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ray import ObjectRef
from ray.exceptions import RayActorError

from kvres.actors.config import SessionPolicy
from kvres.actors.host.journal import SessionRecord
from kvres.policy import SessionExistsError, UnknownSessionError
from kvres.policy.errors import BackendLostError

from .remote_calls import answer, call


class BackendClient:
    def __init__(self, name: str, handle: Callable[[], Any], revive: Callable[[], None]) -> None:
        self.name = name
        self._handle = handle
        self._revive = revive

    def __repr__(self) -> str:
        return f"BackendClient({self.name!r})"

    def _call(self, submit: Callable[[Any], Any], retry_ok: tuple[type[BaseException], ...] = (),
              once: bool = False) -> Any:
        if once:
            return answer(submit(self._handle()))
        return call(lambda: submit(self._handle()), self._revive, BackendLostError, f"backend {self.name!r}",
                    retry_ok=retry_ok)

    # -- sessions -------------------------------------------------------------------------------
    def open_session(self, session_id: str, policy: SessionPolicy | None) -> None:
        """A repeat that finds the session open means the first attempt opened it."""
        self._call(lambda h: h.open_session.remote(session_id, policy), retry_ok=(SessionExistsError,))

    def append(self, session_id: str, tokens: Sequence[int], request_id: str) -> int:
        return int(self._call(lambda h: h.append.remote(session_id, list(tokens), request_id)))

    def append_text(self, session_id: str, text: str, request_id: str) -> list[int]:
        return [int(t) for t in self._call(lambda h: h.append_text.remote(session_id, text, request_id))]

    def generate(self, session_id: str, max_tokens: int, temperature: float, seed: int | None,
                 request_id: str) -> list[int]:
        return [int(t) for t in self._call(
            lambda h: h.generate.remote(session_id, max_tokens, temperature, seed, request_id))]

    def stream(self, session_id: str, max_tokens: int, temperature: float, seed: int | None,
               request_id: str) -> Iterator[int]:
        """Tokens as the backend produces them (a Ray streaming generator). After a death the
        request is sent again once the backend is back: the same sampler and seed give the same
        tokens, and those already handed out are skipped."""
        delivered = 0
        for attempt in (1, 2):
            produced = 0
            try:
                for ref in self._handle().stream.remote(session_id, max_tokens, temperature, seed, request_id):
                    token = int(answer(ref))
                    produced += 1
                    if produced > delivered:
                        delivered = produced
                        yield token
                return
            except RayActorError as exc:
                if attempt == 2:
                    raise BackendLostError(
                        f"backend {self.name!r} died twice during one stream ({type(exc).__name__}); "
                        f"{delivered} tokens were handed out and not committed: repeat the call"
                    ) from None
                self._revive()

    def suspend(self, session_id: str) -> None:
        self._call(lambda h: h.suspend.remote(session_id))

    def resume(self, session_id: str, record: SessionRecord | None = None, once: bool = False) -> int:
        """Tokens recomputed. With ``record`` (handed over by another backend) the session comes
        from it instead of this backend's own record."""
        return int(self._call(lambda h: h.resume.remote(session_id, record), once=once) or 0)

    def detach(self, session_id: str, once: bool = False) -> SessionRecord:
        """The session's record, taken off this backend (served by none until it is resumed)."""
        record: SessionRecord = self._call(lambda h: h.detach.remote(session_id), once=once)
        return record

    def close(self, session_id: str) -> None:
        """A repeat that finds the session gone means the first attempt closed it."""
        self._call(lambda h: h.close.remote(session_id), retry_ok=(UnknownSessionError,))

    def session_stats(self, session_id: str) -> dict[str, Any]:
        return dict(self._call(lambda h: h.session_stats.remote(session_id)))

    # -- the backend ----------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return [int(t) for t in self._call(lambda h: h.tokenize.remote(text, add_bos))]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return str(self._call(lambda h: h.detokenize.remote(list(tokens))))

    def ping_ref(self) -> ObjectRef[str]:
        """The node id the backend runs on, once it has started (its constructor has run)."""
        ref: ObjectRef[str] = self._handle().ping.remote()
        return ref

    def stats_ref(self) -> ObjectRef[dict[str, Any]]:
        ref: ObjectRef[dict[str, Any]] = self._handle().stats.remote()
        return ref
