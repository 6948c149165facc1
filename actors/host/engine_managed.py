"""The step of a backend whose engine evicts by itself (openvino-genai): each call runs whole.

Primitives:
- ``ManagedStepper(ctx, executor, durability, parking)``: ``step(jobs)`` runs every pending call at
  once on the engine (it cannot batch across sessions from here), a suspended session resumed
  first; ``open_on_engine`` tells the engine the session's eviction (``Residency.engine_eviction``);
  ``check_policy`` refuses policies that need kvres to evict.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from kvres.policy import CapabilityError
from kvres.policy.residency import Residency

from ..config import SessionPolicy
from ..engines.executor import EngineManagedExecutor
from .admission import check_managed_policy
from .context import HostContext
from .durability import Durability
from .parking import Parking
from .scheduler import Job
from .sessions import HostSession
from .stepper import complete


class ManagedStepper:
    step_tokens = 0  # not stepped token by token

    def __init__(self, ctx: HostContext, executor: EngineManagedExecutor, durability: Durability,
                 parking: Parking) -> None:
        self.ctx = ctx
        self.executor = executor
        self.durability = durability
        self.parking = parking

    def check_policy(self, policy: SessionPolicy, residency: Residency) -> None:
        check_managed_policy(self.ctx, policy, residency)

    def open_on_engine(self, session_id: str, s: HostSession, tokens: Sequence[int]) -> None:
        self.executor.open_session(session_id, tokens)
        eviction = s.residency.engine_eviction()
        if eviction is not None:
            self.executor.set_eviction(session_id, eviction.stream, eviction.budget_tokens, eviction.aggregation)

    def step(self, jobs: list[Job]) -> bool:
        for job in jobs:
            self._run(job)
        return True

    def _run(self, job: Job) -> None:
        ctx = self.ctx
        try:
            s = ctx.sessions.get(job.session_id)
            if s is not None and not s.live:
                self.parking.resume(job.session_id, None)
            started = time.perf_counter()
            if job.kind == "append":
                self.executor.append(job.session_id, job.feed)
                ctx.loop.profile.engine(time.perf_counter() - started, len(job.feed))
                ctx.metrics.count_tokens(ctx.name, "prompt", len(job.feed))
            else:
                request = job.request
                assert request is not None
                params = request.sampling
                if request.stop or request.stop_token_ids or params.filtered or params.penalized \
                        or params.needs_grammar or params.logprobs:
                    raise CapabilityError(
                        f"backend {ctx.name!r} ({ctx.config.engine}) generates by temperature and seed only: "
                        "no stop strings or ids, top-k / top-p / min-p, penalties, grammar or logprobs")
                tokens = self.executor.generate(job.session_id, job.remaining, params.temperature, params.seed)
                ctx.loop.profile.engine(time.perf_counter() - started, len(tokens))
                for token in tokens:
                    job.emit(token)
                if tokens and job.stop is not None and tokens[-1] in job.stop.eog:
                    job.finish_reason = "eos"
                ctx.metrics.count_tokens(ctx.name, "generated", len(tokens))
            complete(ctx, self.durability, job)
        except Exception as exc:
            self.durability.fail(job, exc)
