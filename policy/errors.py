"""Typed errors shared by every layer.

Primitives:
- ``KvresError``: the base of every kvres error.
- ``UnknownSessionError`` (also a KeyError), ``SessionExistsError``,
  ``RangeError`` (also a ValueError): a range outside the session or in the wrong residency state,
  ``ContextLengthError`` (a ``RangeError``): a call's tokens would take a session past the most it
  can hold (a policy that keeps every token, on a backend it fills alone, or an engine that
  prefills its whole log in each request); nothing was applied,
  ``CapabilityError``: the backend cannot do what was asked,
  ``ModelLoadError``: a model file is missing or not what it claims to be,
  ``BlockMismatchError``: a KV block made by another model / KV type / geometry,
  ``ActorLostError``: a kvres actor died or could not be reached in time (``BackendLostError``,
  ``PlannerLostError``, ``ColdStoreLostError`` say which); the message says what to do.
  ``NodeLostError`` (a ``BackendLostError``): the node a backend was pinned to died, so it cannot
  come back; ``ColdStoreGoneError`` (a ``ColdStoreLostError``): a store whose node died, its
  blocks gone for good (recomputed from the token log).
  ``BackendStartError`` (a ``BackendLostError``): a backend could not start (its engine raised, or
  its process died starting too many times in a row); ``backend``, ``reason`` (the engine's own
  words) and ``attempts`` say which, why and how often.
- ``ClusterRestartedError`` (an ``UnknownSessionError``): the session belonged to an earlier run of
  the cluster, whose head restarted without GCS fault tolerance.
"""

from __future__ import annotations


class KvresError(Exception):
    """Base of every kvres error."""


class UnknownSessionError(KvresError, KeyError):
    def __init__(self, session_id: str, why: str = "") -> None:
        super().__init__(f"unknown session id {session_id!r}" + (f": {why}" if why else ""))
        self.session_id = session_id
        self.why = why

    def __reduce__(self) -> tuple[type[UnknownSessionError], tuple[str, str]]:
        return type(self), (self.session_id, self.why)  # rebuilt from its parts (no doubled text)

    def __str__(self) -> str:
        return str(self.args[0])


class SessionExistsError(KvresError, ValueError):
    def __init__(self, session_id: str) -> None:
        super().__init__(f"session id {session_id!r} is already open")
        self.session_id = session_id

    def __reduce__(self) -> tuple[type[SessionExistsError], tuple[str]]:
        return type(self), (self.session_id,)  # rebuilt from the id, not the message (no doubled text)


class ArgumentError(KvresError, TypeError):
    """An argument of a public call has the wrong type; the message names it and its value."""


class RangeError(KvresError, ValueError):
    """A token range outside a session, or not in the residency state an operation needs."""


class ContextLengthError(RangeError):
    """A call would take a session past its context limit: the most tokens it can hold where its
    policy keeps every token resident, or where its engine prefills the whole log in each request
    (``kvres.actors.host.context_limit``). Nothing of the call was applied; the session is as it was."""


class CapabilityError(KvresError, NotImplementedError):
    """The backend cannot perform the requested operation (see its Capabilities)."""


class ModelLoadError(KvresError, ValueError):
    """A model file is missing, unreadable, or not the format it should be."""


class BlockMismatchError(KvresError, ValueError):
    """A KV block belongs to another model, KV type or geometry than the executor's."""


class ActorLostError(KvresError, RuntimeError):
    """A kvres actor died during a call, or did not come back in time after dying."""


class BackendLostError(ActorLostError):
    """A backend died; its sessions are rebuilt from their journal when it comes back."""


class PlannerLostError(ActorLostError):
    """The planner died; its directory is rebuilt from Ray's GCS when it comes back."""


class ColdStoreLostError(ActorLostError):
    """A cold store died; blocks on its disk tier survive, the others are recomputed from the log."""


class NodeLostError(BackendLostError):
    """The node a backend was pinned to (``BackendConfig.node_id``) died: the backend is not
    re-created elsewhere; its sessions move to a live backend of the same model."""


class BackendStartError(BackendLostError):
    """A backend could not start: its engine raised while it was being built, or its process died
    while starting (a native abort) as many times in a row as a backend may try. It is not started
    again by a call: every call on its sessions raises this at once."""

    def __init__(self, backend: str, reason: str, attempts: int = 1) -> None:
        tries = f"{attempts} attempt{'' if attempts == 1 else 's'}"
        super().__init__(f"backend {backend!r} could not start ({tries}): {reason}; its sessions are kept in "
                         "the journal: fix the cause, then connect() again to start it")
        self.backend = backend
        self.reason = reason
        self.attempts = attempts

    def __reduce__(self) -> tuple[type[BackendStartError], tuple[str, str, int]]:
        return type(self), (self.backend, self.reason, self.attempts)


class ColdStoreGoneError(ColdStoreLostError):
    """A cold store whose node died: its blocks are gone for good; their tokens are recomputed
    from the session's token log."""


class ClusterRestartedError(UnknownSessionError):
    """A session of an earlier run of the cluster: its head restarted without GCS fault
    tolerance, and the sessions, journal and blocks of that run are gone."""
