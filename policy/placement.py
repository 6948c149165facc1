"""Where a new session goes, decided from the load backends push, never by asking every backend.

Primitives:
- ``LoadReport``: what a backend pushes to the planner: name, node and its labels, model (path and
  id), engine (its name, and ``engine_evicts``: whether it evicts by itself, from the engine's
  spec), budget, resident and free tokens, live and suspended sessions, ``n_seq_max``, and
  ``at``, the backend's wall clock when it measured all that.
- ``ReportLimiter(min_interval_s, change_fraction, heartbeat_s)``: when a backend pushes:
  ``offer(report, now) -> bool`` (push now?), ``held(now) -> LoadReport | None`` (a report held
  back earlier that may go now).
- ``PlacementPolicy(kind, labels)``: the placement policy a user chooses: ``"least_loaded"`` (most free
  tokens, then fewest sessions), ``"pack"`` (the fullest backend that still fits the session, so
  the others stay free for large sessions), ``"label"`` (only backends whose node carries
  ``labels``, least loaded among them); ``labels`` narrow the other two kinds as well.
- ``BackendLoad``: a report plus the sessions placed on the backend since it was measured.
- ``LoadView``: the planner's picture: ``seed`` (what the configuration says of a backend that has
  not reported yet: empty), ``report``, ``place(session_id, model, placement, ...)``,
  ``forget_session``, ``loads()``, ``totals()``.
- ``choose_backend(loads, model, placement, need, demand_tokens) -> str`` (``loads``: any
  ``Load``, a report plus pending placements), ``serves(report, model)`` and ``runs(report,
  need)``: the pure choice.
- ``PlacementError``, ``LoadReportError``.

Sessions of a model go only to backends of that model (``model`` matches a backend's model path,
its file name, or its model id), and only to backends whose engine can run the session's policy
(``EngineNeed``: a policy the engine evicts by itself needs an engine that does,
``LoadReport.engine_evicts``; one kvres evicts needs any other engine).
A session placed since a backend's last report counts against it (its budget as demand, one
sequence slot) until a report measured after the placement arrives, so a burst of openings
spreads out even when reports lag. A placement is one pass over the backends in the view, in pure
Python (about a microsecond per backend), and no remote call.
"""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Literal, Protocol, cast

from .errors import KvresError
from .residency import EngineNeed

PlacementKind = Literal["least_loaded", "pack", "label"]
PLACEMENT_KINDS: tuple[str, ...] = ("least_loaded", "pack", "label")


class LoadReportError(KvresError, ValueError):
    """A load report with a value out of range."""


class PlacementError(KvresError, ValueError):
    """No backend can take the session (wrong model, engine, labels or size), or a bad policy."""


@dataclass(frozen=True)
class LoadReport:
    backend: str
    budget_tokens: int
    resident_tokens: int = 0
    live_sessions: int = 0
    suspended_sessions: int = 0
    n_seq_max: int = 1
    model: str = ""  # the model file's path, as the backend was configured
    model_id: str | None = None  # SHA-256 of the model file, when the backend knows it
    engine: str = ""  # the engine's name ("" unknown)
    node: str = ""  # the Ray node id ("" unknown)
    labels: Mapping[str, str] = field(default_factory=dict)  # the node's labels
    at: float = 0.0  # the backend's wall clock when measured; 0: never measured (a seed)
    engine_evicts: bool = False  # the engine evicts by itself (kvres does not address its KV)

    def __post_init__(self) -> None:
        if not self.backend:
            raise LoadReportError("LoadReport.backend must be a non-empty name")
        for name in ("budget_tokens", "resident_tokens", "live_sessions", "suspended_sessions", "n_seq_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise LoadReportError(f"LoadReport.{name} must be an int >= 0, got {value!r} ({self.backend})")
        if self.n_seq_max < 1:
            raise LoadReportError(f"LoadReport.n_seq_max must be >= 1, got {self.n_seq_max} ({self.backend})")
        if not self.at >= 0:
            raise LoadReportError(f"LoadReport.at must be a time >= 0, got {self.at!r} ({self.backend})")

    @property
    def free_tokens(self) -> int:
        return self.budget_tokens - self.resident_tokens

    @property
    def measured(self) -> bool:
        return self.at > 0

    @functools.cached_property
    def model_names(self) -> frozenset[str]:
        """The names a placement may ask this backend's model by: path, file name, model id."""
        path = _norm(self.model)
        return frozenset(n for n in (path, posixpath.basename(path), self.model_id) if n)

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["labels"] = dict(self.labels)
        out["free_tokens"] = self.free_tokens
        return out


@dataclass
class ReportLimiter:
    """Pushes at most one report per ``min_interval_s``; between those, only when the load moved:
    a session opened, closed, suspended or resumed, or resident tokens changed by more than
    ``change_fraction`` of the budget; and at least every ``heartbeat_s`` while offered reports,
    so small drifts reach the planner too. ``now`` is any monotonic clock, in seconds.

    Why at most two a second: a backend whose sessions outnumber its slots parks one and brings one
    back every turn, so its load moves with every turn; each report is a Ray call the planner
    answers in Python (~1-1.5 ms of CPU on both sides on the 2-core machine), and on two cores every
    millisecond beside the engine's two threads stalls them both. Placement does not wait for the
    next report: a session placed since a backend's last report counts against it until then."""

    min_interval_s: float = 0.5
    change_fraction: float = 0.05
    heartbeat_s: float = 2.0
    _pushed: LoadReport | None = field(default=None, init=False, repr=False)
    _pushed_at: float = field(default=0.0, init=False, repr=False)
    _held: LoadReport | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("min_interval_s", "change_fraction", "heartbeat_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise LoadReportError(f"ReportLimiter.{name} must be >= 0, got {value!r}")

    def changed(self, report: LoadReport) -> bool:
        last = self._pushed
        if last is None:
            return True
        shape = ("live_sessions", "suspended_sessions", "budget_tokens", "n_seq_max", "model", "engine", "node")
        if any(getattr(report, k) != getattr(last, k) for k in shape):
            return True
        moved = abs(report.resident_tokens - last.resident_tokens)
        return moved > self.change_fraction * max(1, last.budget_tokens)

    def offer(self, report: LoadReport, now: float) -> bool:
        """Whether to push ``report`` now (it then counts as pushed); otherwise it is held."""
        elapsed = now - self._pushed_at
        due = self._pushed is None or (
            elapsed >= self.min_interval_s and (elapsed >= self.heartbeat_s or self.changed(report))
        )
        if due:
            self._pushed, self._pushed_at, self._held = report, now, None
        elif self._pushed is not None and self.changed(report):
            self._held = report
        return due

    def held_due(self) -> float | None:
        """When the report held back may go out (None: none is held)."""
        return None if self._held is None else self._pushed_at + self.min_interval_s

    def held(self, now: float) -> LoadReport | None:
        """The last report held back for a change, once ``min_interval_s`` has passed (it then
        counts as pushed): for a backend that goes quiet right after a change."""
        if self._held is None or now - self._pushed_at < self.min_interval_s:
            return None
        report, self._held = self._held, None
        self._pushed, self._pushed_at = report, now
        return report


@dataclass(frozen=True)
class PlacementPolicy:
    kind: PlacementKind = "least_loaded"
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in PLACEMENT_KINDS:
            raise PlacementError(f"placement kind must be one of {list(PLACEMENT_KINDS)}, got {self.kind!r}")
        if self.kind == "label" and not self.labels:
            raise PlacementError("placement kind 'label' needs labels, e.g. {'zone': 'a'}")

    @classmethod
    def of(cls, value: PlacementPolicy | str | None, default: PlacementPolicy | None = None) -> PlacementPolicy:
        """``value`` as a PlacementPolicy: a kind name, a PlacementPolicy, or ``None`` for ``default``."""
        if value is None:
            return default or cls()
        if isinstance(value, PlacementPolicy):
            return value
        if value not in PLACEMENT_KINDS:
            raise PlacementError(f"placement kind must be one of {list(PLACEMENT_KINDS)}, got {value!r}")
        return cls(kind=cast(PlacementKind, value))


@dataclass(frozen=True)
class BackendLoad:
    report: LoadReport
    pending_sessions: int = 0  # placed here since the report was measured
    pending_tokens: int = 0  # their budgets

    @property
    def name(self) -> str:
        return self.report.backend

    @property
    def sessions(self) -> int:
        return self.report.live_sessions + self.pending_sessions

    @property
    def free_tokens(self) -> int:
        return self.report.free_tokens - self.pending_tokens

    @property
    def has_slot(self) -> bool:
        return self.sessions < self.report.n_seq_max

    def as_dict(self) -> dict[str, object]:
        return {**self.report.as_dict(), "pending_sessions": self.pending_sessions,
                "pending_tokens": self.pending_tokens}


def _norm(model: str) -> str:
    return posixpath.normpath(model) if model else ""


def serves(report: LoadReport, model: str | None) -> bool:
    """Whether the backend runs ``model``: its path, its file name, or its model id."""
    return model is None or _norm(model) in report.model_names


def runs(report: LoadReport, need: EngineNeed) -> bool:
    """Whether the backend's engine can run a session that needs ``need``."""
    if need is EngineNeed.ANY:
        return True
    return report.engine_evicts == (need is EngineNeed.ENGINE_MANAGED)


class Load(Protocol):
    """A backend as placement sees it: its last report and the sessions placed since."""

    @property
    def report(self) -> LoadReport: ...

    @property
    def pending_sessions(self) -> int: ...

    @property
    def pending_tokens(self) -> int: ...


def choose_backend(
    loads: Iterable[Load],
    model: str | None = None,
    placement: PlacementPolicy | None = None,
    need: EngineNeed = EngineNeed.ANY,
    demand_tokens: int = 0,
) -> str:
    """The backend for a new session; ties go to the earliest in ``loads``. One pass, no
    allocation per backend: it runs for every placement over every backend in the view."""
    placement = placement or PlacementPolicy()
    if demand_tokens < 0:
        raise PlacementError(f"demand_tokens must be >= 0, got {demand_tokens}")
    loads = list(loads)
    want = None if model is None else _norm(model)
    labels = tuple(placement.labels.items())
    pack = placement.kind == "pack"
    best: Load | None = None
    best_key = (False, 0, 0)
    packed: Load | None = None
    packed_key = (0, 0)
    for load in loads:
        r = load.report
        if (want is not None and want not in r.model_names) or demand_tokens > r.budget_tokens:
            continue
        if not runs(r, need):
            continue
        if labels and any(r.labels.get(k) != v for k, v in labels):
            continue
        sessions = r.live_sessions + load.pending_sessions
        free = r.budget_tokens - r.resident_tokens - load.pending_tokens
        slot = sessions < r.n_seq_max
        if best is None or (slot, free, -sessions) > best_key:  # a free slot, then free tokens, then fewer sessions
            best, best_key = load, (slot, free, -sessions)
        if pack and slot and free >= demand_tokens and (packed is None or (free, -sessions) < packed_key):
            packed, packed_key = load, (free, -sessions)  # the fullest that still fits
    if packed is not None:
        return packed.report.backend
    if best is not None:
        return best.report.backend
    raise _no_backend(loads, model, placement, need, demand_tokens)


def _no_backend(
    loads: Sequence[Load], model: str | None, placement: PlacementPolicy, need: EngineNeed, demand_tokens: int
) -> PlacementError:
    """Why no backend could take the session, naming the first condition nobody met."""
    pool = [b.report for b in loads if serves(b.report, model)]
    if not pool:
        served = sorted({b.report.model for b in loads})
        return PlacementError(f"no backend serves model {model!r}; backends serve {served}")
    pool = [r for r in pool if runs(r, need)]
    if not pool:
        which = "only one that evicts by itself" if need is EngineNeed.ENGINE_MANAGED else "not one that evicts by itself"
        return PlacementError(f"no backend of model {model!r} runs a session that needs an {need.value} engine "
                              f"({which} can)")
    labelled = [r for r in pool if all(r.labels.get(k) == v for k, v in placement.labels.items())]
    if not labelled:
        seen = {r.backend: dict(r.labels) for r in pool}
        return PlacementError(f"no backend of model {model!r} is on a node labelled "
                              f"{dict(placement.labels)}; their nodes' labels: {seen}")
    largest = max(r.budget_tokens for r in labelled)
    return PlacementError(f"a session of budget_tokens={demand_tokens} fits no backend: the largest "
                          f"kv_budget_tokens of those that could take it is {largest}")


class _Entry:
    """A backend in the view: its report, and the sessions placed since it was measured."""

    def __init__(self, report: LoadReport) -> None:
        self.report = report
        self.pending: dict[str, tuple[int, float]] = {}  # session -> (tokens, placed at)
        self.pending_sessions = 0
        self.pending_tokens = 0

    def add(self, session_id: str, tokens: int, at: float) -> None:
        self.pending[session_id] = (tokens, at)
        self.pending_sessions += 1
        self.pending_tokens += tokens

    def drop(self, session_id: str) -> None:
        tokens, _ = self.pending.pop(session_id)
        self.pending_sessions -= 1
        self.pending_tokens -= tokens


class LoadView:
    """Backends' last reports and the sessions placed since. Pure: the caller passes the clock."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._pending_at: dict[str, str] = {}  # session -> backend it is pending on
        self._by_model: dict[str, list[_Entry]] | None = None  # model name -> its backends, in order

    def _set(self, entry: _Entry, report: LoadReport) -> None:
        if entry.report.model_names != report.model_names:
            self._by_model = None
        entry.report = report

    def _of_model(self, model: str | None) -> Iterable[_Entry]:
        """The backends a placement for ``model`` looks at: those of the model (every one when
        none matches, so the error can say what is served)."""
        if model is None:
            return self._entries.values()
        if self._by_model is None:
            self._by_model = {}
            for e in self._entries.values():
                for name in e.report.model_names:
                    self._by_model.setdefault(name, []).append(e)
        return self._by_model.get(_norm(model)) or self._entries.values()

    def seed(self, reports: Iterable[LoadReport]) -> None:
        """Backends known from the configuration: empty until they report. A backend that has
        reported keeps its report."""
        for r in reports:
            entry = self._entries.get(r.backend)
            if entry is None:
                self._entries[r.backend] = _Entry(r)
                self._by_model = None
            elif not entry.report.measured:
                self._set(entry, r)

    def report(self, report: LoadReport) -> None:
        """A backend's measured load; placements made before it was measured are in it."""
        entry = self._entries.get(report.backend)
        if entry is None:
            entry = self._entries[report.backend] = _Entry(report)
            self._by_model = None
        if report.at < entry.report.at:
            return  # an older measurement overtaken on the way
        self._set(entry, report)
        for sid in [s for s, (_, at) in entry.pending.items() if at <= report.at]:
            entry.drop(sid)
            self._pending_at.pop(sid, None)

    def forget_backend(self, backend: str) -> None:
        entry = self._entries.pop(backend, None)
        self._by_model = None
        for sid in entry.pending if entry else ():
            self._pending_at.pop(sid, None)

    def place(
        self,
        session_id: str,
        now: float,
        model: str | None = None,
        placement: PlacementPolicy | None = None,
        need: EngineNeed = EngineNeed.ANY,
        demand_tokens: int = 0,
    ) -> str:
        backend = choose_backend(self._of_model(model), model, placement, need, demand_tokens)
        self.forget_session(session_id)
        self._entries[backend].add(session_id, demand_tokens, now)
        self._pending_at[session_id] = backend
        return backend

    def forget_session(self, session_id: str) -> None:
        """The session closed, moved or never opened: it no longer counts as pending."""
        backend = self._pending_at.pop(session_id, None)
        entry = self._entries.get(backend) if backend is not None else None
        if entry is not None and session_id in entry.pending:
            entry.drop(session_id)

    def loads(self) -> list[BackendLoad]:
        return [BackendLoad(e.report, e.pending_sessions, e.pending_tokens) for e in self._entries.values()]

    def totals(self) -> dict[str, int]:
        """The cluster at a glance: backends (and how many never reported), budget, resident and
        free tokens, live, suspended and pending sessions."""
        loads = self.loads()
        return {
            "backends": len(loads),
            "unreported": sum(not b.report.measured for b in loads),
            "budget_tokens": sum(b.report.budget_tokens for b in loads),
            "resident_tokens": sum(b.report.resident_tokens for b in loads),
            "free_tokens": sum(b.free_tokens for b in loads),
            "live_sessions": sum(b.report.live_sessions for b in loads),
            "suspended_sessions": sum(b.report.suspended_sessions for b in loads),
            "pending_sessions": sum(b.pending_sessions for b in loads),
        }
