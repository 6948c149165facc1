"""One backend: an executor (one engine instance) and the sessions on it, kept under budget.

Primitives:
- ``BackendHost(config, executor, plan, store, metrics)``: a plain class (works without Ray).
  ``open_session``, ``append``, ``generate``, ``stream``, ``suspend``, ``resume``, ``close``,
  ``session_stats``, ``stats``. Before tokens arrive it asks ``plan`` (the planner: a callable
  taking a ``BackendPlanInput``) for room whenever a session or the backend would go over its
  budget, and carries the plan out: idle sessions suspended to the cold store, ranges evicted
  (exported to the cold store first when the session spills).
- ``SuspendRecord``: everything needed to bring a session back on any backend of the same model.

The executor is a ``kvres.actors.executor.Executor`` (kvres addresses its KV) or an
``EngineManagedExecutor`` (the engine evicts by itself). Blocks go through a
``kvres.actors.store_ports.StorePort``; every operation moves all of its blocks in one batched call
per store (a suspend one ``put_many``, a resume one ``pop_many``, an eviction one ``put_many``).
Whatever a session parked is deleted when it closes. An engine that cannot export KV (a llama.cpp
sliding-window model) suspends by its token log alone and recomputes on resume.

A session's token log is the source of truth: no failure on the way (a lost or corrupt block, a
foreign block) loses tokens; missing KV is recomputed from the log.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from kvres.coldstore import ColdStoreError, KVBlock
from kvres.policy import (
    BlockMismatchError,
    KvresError,
    Range,
    RangeError,
    SessionExistsError,
    StreamPolicy,
    UnknownSessionError,
    subtract_range,
)
from kvres.policy.backend_planner import BackendPlan, BackendPlanInput, SessionView
from kvres.policy.recall import PrefillCost, RecallCosts, TierCost
from kvres.policy.scoring import block_scores, key_mass
from kvres.policy.tokens import token_ids

from .config import BackendConfig, SessionPolicy
from .executor import EngineManagedExecutor, Executor
from .metrics import COUNTERS, Metrics, NullMetrics
from .sampling import TokenSampler
from .store_ports import ColdRef, StorePort

H2O_QUERY_WINDOW = 256


class BackendFullError(KvresError):
    """The backend cannot make room: its budget is taken by sessions it may not evict."""


class ProbedRecallCosts:
    """This device's measured costs (``kvres.actors.probes``), probed on first use and cached per
    device: the RAM tier costs what a measured block import costs, recompute what a measured
    prefill costs. The disk tier has no measured read cost yet, so disk blocks are always read."""

    def __init__(self, model_path: str) -> None:
        self._model_path = model_path
        self._costs: RecallCosts | None = None
        self._probed = False

    def __call__(self) -> RecallCosts | None:
        if not self._probed:
            from .probes import load_probes

            p = load_probes(self._model_path)
            if p.import_gbps is not None and p.prefill_tokens_per_s is not None:
                self._costs = RecallCosts(
                    {"ram": TierCost("ram", p.import_gbps, p.import_latency_s or 0.0)},
                    PrefillCost(p.prefill_tokens_per_s, p.prefill_fixed_s or 0.0),
                )
            self._probed = True
        return self._costs


@dataclass
class SuspendRecord:
    session_id: str
    token_log: list[int]
    resident_ranges: list[Range]
    blocks: list[ColdRef]
    cold: list[ColdRef]
    policy: SessionPolicy
    last_logits: npt.NDArray[np.float32] | None
    counters: dict[str, int]
    fingerprint: str


@dataclass
class _Session:
    policy: SessionPolicy
    last_used: int
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    cold: list[ColdRef] = field(default_factory=list)  # spilled by eviction
    last_logits: npt.NDArray[np.float32] | None = None
    suspended: SuspendRecord | None = None


class BackendHost:
    def __init__(
        self,
        config: BackendConfig,
        executor: Executor | EngineManagedExecutor,
        plan: Callable[[BackendPlanInput], BackendPlan],
        store: StorePort | None = None,
        metrics: Metrics | None = None,
        recall_costs: Callable[[], RecallCosts | None] | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.executor = executor
        self._plan = plan
        self._store = store
        self._metrics = metrics or NullMetrics()
        self._recall_costs = recall_costs
        self._clock = itertools.count(1)
        self._sessions: dict[str, _Session] = {}
        self.fingerprint = executor.fingerprint

    # -- bookkeeping ------------------------------------------------------------------------
    def _get(self, session_id: str, *, live: bool = True) -> _Session:
        s = self._sessions.get(session_id)
        if s is None:
            raise UnknownSessionError(session_id)
        if live and s.suspended is not None:
            raise KvresError(f"session {session_id!r} is suspended; resume it first")
        return s

    def _touch(self, session_id: str) -> _Session:
        s = self._get(session_id)
        s.last_used = next(self._clock)
        return s

    def _count(self, session_id: str, name: str, value: int = 1) -> None:
        self._sessions[session_id].counters[name] += value
        self._metrics.count(name, self.name, session_id, value)

    def _publish(self) -> None:
        total = 0
        for sid, s in self._sessions.items():
            tokens = 0 if s.suspended else self._resident_tokens(sid)
            total += tokens
            self._metrics.set_resident(self.name, sid, tokens)
        self._metrics.set_backend_resident(self.name, total)

    def _resident_tokens(self, session_id: str) -> int:
        return sum(len(r) for r in self.executor.resident_ranges(session_id))

    def sessions(self) -> list[str]:
        return list(self._sessions)

    # -- session lifecycle -----------------------------------------------------------------
    def open_session(self, session_id: str, policy: SessionPolicy | None = None) -> None:
        if session_id in self._sessions:
            raise SessionExistsError(session_id)
        policy = policy or SessionPolicy()
        engine_managed = isinstance(self.executor, EngineManagedExecutor)
        if policy.kind == "engine" and not engine_managed:
            raise ValueError(
                f"policy kind 'engine' needs an engine that evicts by itself (engine='openvino-genai'); "
                f"backend {self.name!r} runs {self.config.engine!r}"
            )
        if engine_managed and policy.kvres_evicts:
            raise ValueError(
                f"backend {self.name!r} runs openvino-genai, whose KV kvres cannot address: policy kind "
                f"{policy.kind!r} is not possible there; use kind='engine' (let the engine evict) or 'none'"
            )
        if policy.kvres_evicts and policy.budget_tokens and policy.budget_tokens > self.config.kv_budget_tokens:
            raise ValueError(
                f"session budget_tokens={policy.budget_tokens} exceeds backend {self.name!r} "
                f"kv_budget_tokens={self.config.kv_budget_tokens}"
            )
        if policy.kind == "scored" and policy.scorer == "h2o" and not self.executor.capabilities().attention_capture:
            raise ValueError(
                f"scorer 'h2o' needs the attention of every query, which backend {self.name!r} "
                f"({self.config.engine}) cannot capture; use scorer='snapkv'"
            )
        self._make_room(session_id, 0, newcomer=True)
        self._open_on_engine(session_id, policy)
        self._sessions[session_id] = _Session(policy, next(self._clock))
        self._publish()

    def _open_on_engine(self, session_id: str, policy: SessionPolicy, tokens: Sequence[int] = ()) -> None:
        self.executor.open_session(session_id, tokens)
        if policy.kind == "engine" and isinstance(self.executor, EngineManagedExecutor):
            self.executor.set_eviction(session_id, StreamPolicy(True, policy.sink_tokens, policy.recent_tokens),
                                       policy.budget_tokens or 0, policy.aggregation)

    def close(self, session_id: str) -> None:
        s = self._get(session_id, live=False)
        if s.suspended is None:
            self.executor.close_session(session_id)
        self._delete_refs(s.cold + (s.suspended.blocks if s.suspended else []))
        del self._sessions[session_id]
        self._metrics.set_resident(self.name, session_id, 0)
        self._publish()

    # -- tokens in and out -----------------------------------------------------------------
    def _chunk(self, policy: SessionPolicy, remaining: int) -> int:
        if not policy.kvres_evicts or policy.budget_tokens is None:
            return remaining
        room = policy.budget_tokens - policy.sink_tokens - policy.recent_tokens
        step = max(1, room // 2)
        return min(remaining, step)

    def append(self, session_id: str, tokens: Sequence[int]) -> int:
        """Append tokens (prefilled in chunks that fit the budget); returns the log length."""
        s = self._touch(session_id)
        toks = token_ids(tokens)
        if not toks:
            raise ValueError("append needs at least one token")
        done = 0
        while done < len(toks):
            n = self._chunk(s.policy, len(toks) - done)
            self._make_room(session_id, n)
            s.last_logits = self.executor.append(session_id, toks[done : done + n])
            done += n
        self._publish()
        return len(self.executor.token_log(session_id))

    def stream(
        self, session_id: str, max_tokens: int, temperature: float = 0.0, seed: int | None = None
    ) -> Iterator[int]:
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        sampler = TokenSampler(temperature, seed)
        s = self._touch(session_id)
        if isinstance(self.executor, EngineManagedExecutor):
            yield from self.executor.generate(session_id, max_tokens, temperature, seed)
            self._publish()
            return
        if s.last_logits is None:
            raise KvresError(f"session {session_id!r} has no tokens yet: append a prompt first")
        produced = 0
        while produced < max_tokens:
            n = self._chunk(s.policy, max_tokens - produced)
            self._make_room(session_id, n)
            for _ in range(n):
                token = sampler.sample(s.last_logits)
                s.last_logits = self.executor.append(session_id, [token])
                produced += 1
                yield token
        self._publish()

    def generate(
        self, session_id: str, max_tokens: int, temperature: float = 0.0, seed: int | None = None
    ) -> list[int]:
        return list(self.stream(session_id, max_tokens, temperature, seed))

    # -- pressure --------------------------------------------------------------------------
    def _view(self, session_id: str, active: str | None, incoming: int) -> SessionView:
        s = self._sessions[session_id]
        p = s.policy
        return SessionView(
            session_id=session_id,
            resident_ranges=tuple(self.executor.resident_ranges(session_id)),
            last_used=s.last_used,
            active=session_id == active,
            incoming_tokens=incoming if session_id == active else 0,
            budget_tokens=p.budget_tokens if p.kvres_evicts else None,
            stream_policy=StreamPolicy(p.kvres_evicts, p.sink_tokens, p.recent_tokens, p.rebase),
            evictable=p.kvres_evicts,
            block_size=p.block_size,
        )

    def _with_scores(self, view: SessionView) -> SessionView:
        s = self._sessions[view.session_id]
        executor = self.executor
        if s.policy.kind != "scored" or not isinstance(executor, Executor):
            return view
        caps = executor.capabilities()
        if not (caps.attention_scores if s.policy.scorer == "snapkv" else caps.attention_capture):
            return view
        table = view.blocks()
        ranges = [table[i].range for i in range(len(table))]
        scores = tuple(self._scores(executor, view.session_id, s.policy, ranges, view.resident_tokens))
        return SessionView(**{**view.__dict__, "scores": scores})

    @staticmethod
    def _scores(
        executor: Executor, session_id: str, policy: SessionPolicy, ranges: list[Range], resident: int
    ) -> list[float]:
        """SnapKV: attention of the last ``observation_window`` tokens, max-pooled (the engine's
        block scores). H2O: attention accumulated by every key over the last
        ``H2O_QUERY_WINDOW`` queries (a bounded stand-in for accumulating over every decode step,
        which would need a capture on each one)."""
        if policy.scorer == "snapkv":
            return executor.block_attention_scores(session_id, ranges, window=policy.observation_window)
        capture = executor.attention(session_id, window=max(1, min(H2O_QUERY_WINDOW, resident)))
        keys = key_mass(capture.probs)
        return [float(x) for x in block_scores(keys, capture.key_positions, ranges)]

    def _needs_plan(self, views: list[SessionView]) -> bool:
        total = sum(v.resident_tokens + v.incoming_tokens for v in views)
        if total > self.config.kv_budget_tokens:
            return True
        return any(
            v.budget_tokens is not None and v.resident_tokens + v.incoming_tokens > v.budget_tokens
            for v in views
        )

    def _make_room(self, active: str | None, incoming: int, newcomer: bool = False) -> None:
        """Ask the planner for room for ``incoming`` tokens of session ``active`` (a ``newcomer``
        is not on the engine yet: a session being opened or resumed) and carry the plan out."""
        live = [sid for sid, s in self._sessions.items() if s.suspended is None and sid != active]
        views = [self._view(sid, active, incoming) for sid in live]
        if newcomer:
            if len(live) >= self._max_live_sessions():
                # every sequence slot is taken: the least recently used session has to go
                idle = min(views, key=lambda v: v.last_used)
                self.suspend(idle.session_id)
                self._count(idle.session_id, "suspends")
                views.remove(idle)
            views.append(SessionView(active or "", (), last_used=1 << 62, active=True,
                                     incoming_tokens=incoming))
        elif active is not None:
            views.append(self._view(active, active, incoming))
        if not self._needs_plan(views):
            return
        views = [self._with_scores(v) if v.active and not newcomer else v for v in views]
        t0 = time.perf_counter()
        plan = self._plan(BackendPlanInput(views, self.config.kv_budget_tokens, self.executor.capabilities()))
        self._metrics.observe_plan_ms(self.name, (time.perf_counter() - t0) * 1e3)
        for action in plan.actions:
            if action.kind == "suspend":
                self.suspend(action.session_id)
                self._count(action.session_id, "suspends")
            else:
                self._evict(action.session_id, action.ranges, action.rebase)
        if plan.over_budget:
            raise BackendFullError(
                f"backend {self.name!r} cannot fit {incoming} more tokens for session {active!r} "
                f"within kv_budget_tokens={self.config.kv_budget_tokens}: "
                + "; ".join(plan.diagnostics[-2:])
            )

    def _max_live_sessions(self) -> int:
        return self.config.n_seq_max

    def _kv_executor(self, what: str) -> Executor:
        if not isinstance(self.executor, Executor):
            raise KvresError(f"backend {self.name!r} ({self.config.engine}) cannot {what}: the engine manages its KV")
        return self.executor

    def _evict(self, session_id: str, ranges: Sequence[Range], rebase: bool) -> None:
        """Evict ``ranges``; a spilling session parks them first, all in one store call."""
        executor = self._kv_executor("evict")
        s = self._sessions[session_id]
        ordered = sorted(ranges, reverse=True)
        if s.policy.spill and self._store is not None and executor.capabilities().kv_export:
            s.cold.extend(self._park([executor.export_range(session_id, r) for r in ordered]))
            self._count(session_id, "spills", len(ordered))
        for rng in ordered:
            executor.evict_range(session_id, rng, rebase=rebase)
            self._count(session_id, "evictions")

    # -- the cold store ----------------------------------------------------------------------
    def _park(self, blocks: list[KVBlock]) -> list[ColdRef]:
        assert self._store is not None
        return self._store.refs(self._store.put_many(blocks), blocks)

    def _by_store(self, refs: Sequence[ColdRef]) -> dict[str, list[int]]:
        groups: dict[str, list[int]] = {}
        for i, ref in enumerate(refs):
            groups.setdefault(ref.store, []).append(i)
        return groups

    def _pop(self, refs: Sequence[ColdRef], costs: RecallCosts | None) -> list[KVBlock | None]:
        """The blocks behind ``refs``, removed from their stores: one ``pop_many`` per store."""
        assert self._store is not None
        out: list[KVBlock | None] = [None] * len(refs)
        for store, idx in self._by_store(refs).items():
            popped = self._store.at(store).pop_many(
                [refs[i].key for i in idx], [refs[i].nbytes for i in idx], costs)
            for i, block in zip(idx, popped, strict=True):
                out[i] = block
        return out

    def _tiers(self, refs: Sequence[ColdRef]) -> list[str | None]:
        out: list[str | None] = [None] * len(refs)
        if self._store is None:
            return out
        for store, idx in self._by_store(refs).items():
            for i, tier in zip(idx, self._store.at(store).tiers([refs[i].key for i in idx]), strict=True):
                out[i] = tier
        return out

    def _delete_refs(self, refs: Sequence[ColdRef]) -> None:
        if self._store is None:
            return
        for store, idx in self._by_store(refs).items():
            self._store.at(store).delete_many([refs[i].key for i in idx])

    # -- suspend / resume ------------------------------------------------------------------
    def suspend(self, session_id: str) -> SuspendRecord:
        """Export all of the session's KV to the cold store and free it on the engine."""
        s = self._get(session_id)
        if self._store is None:
            raise KvresError(f"backend {self.name!r} has no cold store: cannot suspend {session_id!r}")
        resident = self.executor.resident_ranges(session_id)  # none where the engine manages KV
        refs: list[ColdRef] = []
        if resident and self.executor.capabilities().kv_export:
            executor = self._kv_executor("suspend")
            refs = self._park([executor.export_range(session_id, r) for r in resident])
        record = SuspendRecord(
            session_id, self.executor.token_log(session_id), resident, refs, list(s.cold),
            s.policy, s.last_logits, dict(s.counters), self.fingerprint,
        )
        self.executor.close_session(session_id)
        s.suspended = record
        self._publish()
        return record

    def detach(self, session_id: str) -> SuspendRecord:
        """Suspend and forget the session here (it moves to another backend)."""
        s = self._get(session_id, live=False)
        record = s.suspended or self.suspend(session_id)
        del self._sessions[session_id]
        self._metrics.set_resident(self.name, session_id, 0)
        self._publish()
        return record

    def resume(self, session_id: str, record: SuspendRecord | None = None) -> int:
        """Bring a suspended session back (from this backend's record or one handed over);
        returns the number of tokens that had to be recomputed."""
        if record is None:
            record = self._get(session_id, live=False).suspended
            if record is None:
                return 0  # already live
        elif session_id in self._sessions:
            raise SessionExistsError(session_id)
        if self._store is None:
            raise KvresError(f"backend {self.name!r} has no cold store: cannot resume {session_id!r}")
        previous = self._sessions.pop(session_id, None)
        try:
            self._make_room(session_id, sum(len(r) for r in record.resident_ranges), newcomer=True)
            self._open_on_engine(session_id, record.policy, record.token_log)
        except BaseException:
            if previous is not None:
                self._sessions[session_id] = previous  # still suspended, nothing lost
            raise
        s = _Session(record.policy, next(self._clock), dict(record.counters), list(record.cold),
                     record.last_logits)
        self._sessions[session_id] = s
        try:
            recomputed = self._restore(session_id, record) if record.resident_ranges else 0
        except BaseException:
            self.executor.close_session(session_id)
            if previous is not None:
                self._sessions[session_id] = previous
            else:
                del self._sessions[session_id]
            raise
        self._publish()
        return recomputed

    def _restore(self, session_id: str, record: SuspendRecord) -> int:
        """Import the parked blocks worth reading (one ``pop_many`` per store, which also frees
        them), recompute the rest from the token log."""
        executor = self._kv_executor("resume")
        costs = self._recall_costs() if self._recall_costs is not None else None
        for block in self._pop(record.blocks, costs):
            if block is None:
                continue  # gone, unreadable or cheaper to recompute: recomputed below
            try:
                executor.import_range(session_id, block)
                self._count(session_id, "admissions")
            except (ColdStoreError, BlockMismatchError, RangeError):
                continue
        recomputed = 0
        for rng in record.resident_ranges:
            missing = [rng]
            for have in executor.resident_ranges(session_id):
                missing = [m for part in missing for m in subtract_range([part], have)]
            for part in missing:
                executor.admit_range(session_id, part)
                recomputed += len(part)
        if recomputed:
            self._count(session_id, "recomputed_tokens", recomputed)
        return recomputed

    # -- stats -----------------------------------------------------------------------------
    def session_stats(self, session_id: str) -> dict[str, Any]:
        s = self._get(session_id, live=False)
        live = s.suspended is None
        resident = self.executor.resident_ranges(session_id) if live else []
        refs = list(s.cold) + (list(s.suspended.blocks) if s.suspended else [])
        tiers = self._tiers(refs)
        cold: dict[str, dict[str, int]] = {}
        for ref, tier in zip(refs, tiers, strict=True):
            if tier is None:
                continue
            entry = cold.setdefault(tier, {"blocks": 0, "bytes": 0})
            entry["blocks"] += 1
            entry["bytes"] += ref.nbytes
        return {
            "session_id": session_id,
            "backend": self.name,
            "state": "live" if live else "suspended",
            "policy": s.policy.model_dump(),
            "token_count": len(s.suspended.token_log if s.suspended else self.executor.token_log(session_id)),
            "resident_ranges": [(r.start, r.end) for r in resident],
            "resident_tokens": sum(len(r) for r in resident),
            "cold": cold,
            "counters": dict(s.counters),
        }

    def stats(self) -> dict[str, Any]:
        live = {sid: self._resident_tokens(sid) for sid, s in self._sessions.items() if s.suspended is None}
        return {
            "backend": self.name,
            "engine": self.config.engine,
            "model": str(self.config.model_path),
            "fingerprint": self.fingerprint,
            "kv_budget_tokens": self.config.kv_budget_tokens,
            "resident_tokens": sum(live.values()),
            "free_tokens": self.config.kv_budget_tokens - sum(live.values()),
            "sessions": {
                sid: {"state": "suspended" if s.suspended else "live", "resident_tokens": live.get(sid, 0)}
                for sid, s in self._sessions.items()
            },
        }
