"""Calls to a backend whose actor runs in this very process, made as Python calls instead of Ray calls.

Primitives:
- ``host_here(name, server)`` / ``leave_here(name)``: backend ``name``'s shell (the actor's
  ``BackendServer`` object) runs in this process, and every ``BackendClient`` of it made here
  afterwards calls it directly (``in_process_handle(name) -> InProcessHandle | None``).
- ``hosted_here() -> {name: calls}``: the backends hosted in this process and how many calls each
  answered in process (``/health`` of a front shows it).
- ``InProcessHandle(server)``: ``handle.method.remote(*args, **kwargs)`` as a Ray actor handle takes
  it, answered at once by the shell's method in the caller's thread: a ``Done`` holding its value
  (``remote_calls.answer`` returns it; an error the method raises is raised by ``remote``, where a
  Ray call would raise it from ``answer``: both inside the same ``try``). A streaming method
  (``stream``) gives an iterator of ``Done``s, each item produced only when the caller takes it,
  which is the backpressure the Ray streaming generator gives (one object ahead: none here).

Why: a front hosted in a backend's process (``serve.colocated_front``) serves that backend's
sessions with no Ray call on a turn's path: no serialization of the request, the chunks of tokens
and the answer, no hop between two processes' threads and GILs. Only the operations the client
sends through ``BackendClient._call`` and ``stream_refs`` go this way; ``ping_ref`` and
``stats_ref`` (waited on with ``ray.wait`` by their callers) keep the actor's Ray handle.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Done:
    """An in-process call's answer: what ``remote_calls.answer`` hands back instead of ``ray.get``."""

    value: Any


_hosted: dict[str, InProcessHandle] = {}
_lock = threading.Lock()


def host_here(name: str, server: Any) -> None:
    with _lock:
        _hosted[name] = InProcessHandle(server)


def leave_here(name: str) -> None:
    with _lock:
        _hosted.pop(name, None)


def in_process_handle(name: str) -> InProcessHandle | None:
    return _hosted.get(name)


def hosted_here() -> dict[str, int]:
    with _lock:
        return {name: handle.calls for name, handle in _hosted.items()}


class _Method:
    __slots__ = ("_fn", "_streaming", "_handle")

    def __init__(self, fn: Callable[..., Any], streaming: bool, handle: InProcessHandle) -> None:
        self._fn = fn
        self._streaming = streaming
        self._handle = handle

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        self._handle.calls += 1  # (a count for /health: an unlocked += may lose one under races)
        if kwargs.get("lease") is not None:
            kwargs["lease"] = None  # the caller is this process: it cannot die while the stream runs
        if self._streaming:
            return _answers(self._fn(*args, **kwargs))
        return Done(self._fn(*args, **kwargs))


def _answers(items: Iterator[Any]) -> Iterator[Done]:
    try:
        for item in items:
            yield Done(item)
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()  # the caller left: the shell's stream keeps what it handed out


class InProcessHandle:
    """A Ray actor handle's calling shape over an object of this process."""

    STREAMING = frozenset({"stream"})

    def __init__(self, server: Any) -> None:
        self._server = server
        self.calls = 0

    def __repr__(self) -> str:
        return f"InProcessHandle({self._server!r})"

    def __getattr__(self, method: str) -> _Method:
        if method.startswith("_"):
            raise AttributeError(method)
        return _Method(getattr(self._server, method), method in self.STREAMING, self)
