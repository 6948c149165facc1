"""A host whose engine evicts by itself (openvino-genai): each call runs whole, and whatever needs
kvres to address the KV is refused.

Primitives:
- ``ManagedStepper(ctx, executor, durability, resumption)``: ``step(jobs)`` runs every pending call
  at once on the engine (it cannot batch across sessions from here), a suspended session resumed
  first. Each request prefills the session's whole log, so the log is what the engine holds: an
  append past the session's context limit is refused before any of it goes in, and a generate
  ends there (finish_reason "length"), as on an engine whose KV kvres addresses
  (``context_limit``); ``joins_prompts`` (False: a generate's prompt is appended by a call of its own first) and
  ``sampler(params)`` (None: the engine samples itself), which the facade asks of its stepper.
- ``ManagedKV(ctx, executor)``: this engine's ``kv_access.SessionKV`` and ``pressure.Evictor``:
  ``check_policy`` refuses policies that need kvres to evict, ``open_on_engine`` tells the engine
  the session's eviction (``Residency.engine_eviction``), nothing resident is exported, and what
  only an addressed engine can do (restoring or bringing back resident ranges, evicting) is
  refused with ``KvresError`` ("the engine manages its KV").
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from kvres.coldstore import KVBlock
from kvres.policy import CapabilityError, KvresError, Range, UnknownSessionError
from kvres.policy.backend_planner import SessionView
from kvres.policy.residency import Residency

from ..config import SessionPolicy
from ..engines.executor import EngineManagedExecutor
from ..sampling import Sampler, SamplingParams
from .admission import check_managed_policy
from .context import HostContext
from .context_limit import check_prompt, session_limit
from .durability import Durability
from .resumption import Resumption
from .scheduler import Job
from .sessions import HostSession, SuspendRecord
from .stepper import complete


class ManagedKV:
    def __init__(self, ctx: HostContext, executor: EngineManagedExecutor) -> None:
        self.ctx = ctx
        self.executor = executor

    def _refused(self, what: str) -> KvresError:
        ctx = self.ctx
        return KvresError(f"backend {ctx.name!r} ({ctx.config.engine}) cannot {what}: the engine manages its KV")

    def check_policy(self, policy: SessionPolicy, residency: Residency) -> None:
        check_managed_policy(self.ctx, policy, residency)

    def open_on_engine(self, session_id: str, s: HostSession, tokens: Sequence[int]) -> None:
        self.executor.open_session(session_id, tokens)
        eviction = s.residency.engine_eviction()
        if eviction is not None:
            self.executor.set_eviction(session_id, eviction.stream, eviction.budget_tokens, eviction.aggregation)

    def export_resident(self, session_id: str, ranges: Sequence[Range]) -> list[KVBlock]:
        return []  # nothing of its KV leaves the engine

    def restore(self, session_id: str, record: SuspendRecord) -> int:
        raise self._refused("resume")  # a record with resident ranges, handed over from another engine

    def bring_back(self, session_id: str, s: HostSession, layout: tuple[Range, ...]) -> None:
        raise self._refused("roll back")

    def with_scores(self, view: SessionView, lookahead: Sequence[int] | None = None) -> SessionView:
        return view  # nothing ranks its blocks here

    def evict(self, session_id: str, ranges: Sequence[Range], rebase: bool) -> None:
        raise self._refused("evict")


class ManagedStepper:
    step_tokens = 0  # not stepped token by token
    joins_prompts = False  # the engine takes whole calls: a generate's prompt is appended first

    def __init__(self, ctx: HostContext, executor: EngineManagedExecutor, durability: Durability,
                 resumption: Resumption) -> None:
        self.ctx = ctx
        self.executor = executor
        self.durability = durability
        self.resumption = resumption

    def sampler(self, params: SamplingParams) -> Sampler | None:
        return None  # the engine samples itself

    def step(self, jobs: list[Job]) -> bool:
        ran = [job for job in jobs if not job.done and not job.committing]  # (committing: answered once written)
        for job in ran:
            self._run(job)
        return bool(ran)

    def _run(self, job: Job) -> None:
        ctx = self.ctx
        try:
            s = ctx.sessions.get(job.session_id)
            if s is None:
                raise UnknownSessionError(job.session_id)
            if not s.live:
                self.resumption.resume(job.session_id, None)
            held = len(self.executor.token_log(job.session_id))  # all of it goes into each request
            limit = session_limit(ctx.config, self.executor, s.residency)
            started = time.perf_counter()
            if job.kind == "append":
                check_prompt(ctx.config, self.executor, job.session_id, held, len(job.feed), limit, s.residency)
                self.executor.append(job.session_id, job.feed)
                ctx.jobs.profile.engine(time.perf_counter() - started, len(job.feed))
                ctx.metrics.count_tokens(ctx.name, "prompt", len(job.feed))
            else:
                request = job.request
                assert request is not None
                params = request.sampling
                if request.stop or request.stop_token_ids or params.filtered or params.penalized \
                        or params.needs_grammar or params.wants_logprobs or params.logit_bias:
                    raise CapabilityError(
                        f"backend {ctx.name!r} ({ctx.config.engine}) generates by temperature and seed only: "
                        "no stop strings or ids, top-k / top-p / min-p, penalties, grammar, logprobs or logit_bias")
                room = job.remaining if limit is None else max(0, min(job.remaining, limit - held))
                tokens = self.executor.generate(job.session_id, room, params.temperature, params.seed)
                ctx.jobs.profile.engine(time.perf_counter() - started, len(tokens))
                for token in tokens:
                    job.emit(token)
                if tokens and job.stop is not None and tokens[-1] in job.stop.eog:
                    job.finish_reason = "eos"
                ctx.metrics.count_tokens(ctx.name, "generated", len(tokens))
            complete(ctx, self.durability, job)
        except Exception as exc:
            self.durability.fail(job, exc)
