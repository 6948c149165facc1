"""The step of a backend whose KV kvres addresses: every pending call's share in one engine call.

Primitives:
- ``KVStepper(ctx, executor, durability, pressure, eviction, recall, resumption)``: ``step(jobs)``, the step loop's step
  function (under the host lock): a suspended session's job brings it back first where a slot
  can be had; an empty session's first tokens that a live session holds are shared from it, not
  prefilled (``_share_prefix``); a job with tokens to feed (an append, or a generate given its
  prompt) adds a chunk (a turn's first step recalls its cold blocks first; beside other prompts
  that end in the step only where ``costs``, a ``StepCosts`` fitted to the steps run, says that
  gives their first tokens sooner), a generating job one sampled token, handed out as soon as
  it is sampled (a turn's first one as soon as its prompt's last chunk has its logits: on an
  engine that decodes a step's prompts apart from its decodes, before those run; the session's
  next step decodes it); room is made for each (``Pressure.make_room``, counting what the jobs
  before it bring); then one ``executor.append_many_first`` for the whole batch (its prompts
  first), and each session's logits, counters and scoring after it (``_score``: compression, a
  prompt larger than the free room ranked by its own last tokens, H2O's rows taken before one
  capture overflows). A streamed call ``STREAM_AHEAD`` tokens past its reader sits a step out
  (``Job.waits_for_reader``), and one whose tokens are all out is committed once its reader took
  them. Calls are served in the room queue's order (``RoomQueue.order``: priority,
  then arrival); a call no room can be made for waits there (``RoomQueue.wait``) until a call that
  runs frees room, and calls that have not run yet wait behind it; a room check may park the
  session of a call behind it, never one ahead or one whose call ran (one whose call is being
  committed is done with its slot: parked while its record is written); when no call can run, the
  last waiting one that holds room is parked mid-call (``Pressure.preempt``) so the others go on.
  Past ``max_room_wait_s`` a waiting call fails with ``BackendFullError`` carrying a retry-after
  hint. A prompt past its session's context limit is refused before any of it goes in,
  and a generate ends there ("length"; ``context_limit``). A call that fails is rolled back; a call that is done is
  committed, then answered.
  ``joins_prompts`` (True: a generate's prompt is fed by its own job) and ``sampler(params)``
  (kvres samples each token), which the facade asks of its stepper.

Budget: the step never lets the live sessions hold more than ``kv_budget_tokens`` after it.
"""

from __future__ import annotations

import time

import numpy as np

from kvres.policy import CapabilityError, KvresError, UnknownSessionError
from kvres.policy.step_costs import StepCosts

from ..engines.executor import Executor
from ..generation import Generation, reply_text
from ..sampling import Sampler, SamplingParams, top_log_softmax
from .context import HostContext
from .context_limit import check_prompt, session_limit
from .durability import Durability
from .eviction import Eviction
from .pressure import Pressure
from .quotas import quota_of
from .refusals import BackendFullError
from .resumption import Resumption
from .retention import pinned_sessions
from .scheduler import Job
from .sessions import HostSession
from .spill_recall import Recall

STEP_TOKENS = 512  # tokens one engine step decodes at most (llama.cpp's default n_batch)
PRIME_TOKENS = 1024  # the most of a session's log a sampler's penalties are primed with
SCORE_ROWS = 512  # query rows one attention capture holds on every engine (llama.cpp: one micro-batch)
SHARE_MIN_TOKENS = 32  # the shortest prefix an empty session takes from a live one instead of prefilling
MID_TURN_GRACE_S = 0.5  # after an append, how long its session is kept over others for the reply


def complete(ctx: HostContext, durability: Durability, job: Job) -> None:
    """The call is done: commit the session (with the call's id and answer), then answer
    (``Durability.commit_call``: once the record is written)."""
    job.result = len(ctx.executor.token_log(job.session_id))
    s = ctx.sessions.get(job.session_id)
    if s is not None:  # a turn's reply follows its append: keep the slot for it a moment
        s.touched_at = time.monotonic()
        s.mid_turn_until = s.touched_at + MID_TURN_GRACE_S if job.kind == "append" else 0.0
    answer: object = (job.result - job.appended, job.result) if job.kind == "append" else generation_of(ctx, job)
    if isinstance(answer, Generation):
        answer.length = job.result
        if job.appended:
            answer.prompt_tokens = job.appended  # a generate given its prompt
        if s is not None:  # a chat turn whose conversation left the log: the reply says where
            answer.prefix_break, s.prefix_break = s.prefix_break, None
    durability.commit_call(job, answer)


def generation_of(ctx: HostContext, job: Job) -> Generation:
    """A generate job's answer: its tokens, why it ended, its text where the model has one."""
    try:
        before = ctx.token_log(job.session_id)[job.start_length - 1] if job.start_length > 0 else None
        text: str | None = reply_text(job.produced, job.stopped_by, ctx.executor.detokenize, before)
    except CapabilityError:
        text = None  # a model without a detokenizer (token ids only)
    return Generation(job.produced, job.finish_reason, job.stopped_by, text,
                      None if job.logprobs is None else list(job.logprobs),
                      top_logprobs=None if job.top_logprobs is None else list(job.top_logprobs))


class KVStepper:
    joins_prompts = True  # a generate's prompt goes in with its own job's steps

    def __init__(
        self, ctx: HostContext, executor: Executor, durability: Durability, pressure: Pressure, eviction: Eviction,
        recall: Recall, resumption: Resumption,
    ) -> None:
        self.ctx = ctx
        self.executor = executor
        self.durability = durability
        self.pressure = pressure
        self.eviction = eviction
        self.recall = recall
        self.resumption = resumption
        self.step_tokens = STEP_TOKENS
        self.costs = StepCosts()  # whether a prompt shares a step with others or has the next one

    def sampler(self, params: SamplingParams) -> Sampler | None:
        return self.executor.sampler(params)

    def step(self, jobs: list[Job]) -> bool:
        """One engine step for ``jobs``, served in the room queue's order; True when any of them
        progressed."""
        progressed = self._expire()
        pending = [job for job in jobs if not job.done]
        # a stream runs ahead of its reader no further; a call being committed is done stepping
        jobs = [job for job in pending if not job.committing and not job.waits_for_reader()]
        jobs = self.ctx.room.order(jobs, self._priority)
        ran = {job.session_id for job in pending if job.ran and not job.committing}
        served: set[str] = set()  # the sessions of the calls served so far in this step
        stalled: list[Job] = []  # left waiting for room in this step, in the order served
        batch: list[tuple[Job, list[int]]] = []
        incoming: dict[str, int] = {}
        capacity = self.step_tokens
        held: int | None = None  # what live sessions hold, as of a room check that changed nothing
        rows = sum(1 for job in jobs if job.kind == "generate" and not job.feed)  # this step's decodes
        finishing = 0  # prompts that end in this step
        for job in jobs:
            served.add(job.session_id)
            busy = ran | served  # never parked for this job's room: calls that ran, and those ahead of it
            s = self.ctx.sessions.get(job.session_id)
            if s is None:
                self.durability.fail(job, UnknownSessionError(job.session_id))
                progressed = True
                continue
            if stalled and not job.ran:  # first come, first served: it waits behind the calls waiting for room
                progressed |= self._wait(job, BackendFullError(
                    f"backend {self.ctx.name!r} has no room for session {job.session_id!r}'s call now: "
                    f"it waits behind {len(stalled)} earlier calls for room"), stalled)
                continue
            if not s.live:
                held = None
                admitted = self._admit(job, busy, incoming, stalled)
                progressed |= admitted or job.done
                if not admitted:
                    continue
                s = self.ctx.sessions[job.session_id]
            if self._nothing_to_generate(job, s) or self._at_limit(job, s):
                progressed = True
                continue
            if job.feed and not self.costs.joins(finishing, min(self._want(job, s, incoming), capacity), rows):
                continue  # its first token comes sooner in the next step than the others' would here
            if job.feed and not job.started:
                held = None  # a recall may change what the session holds
                try:
                    check_prompt(self.ctx.config, self.executor, job.session_id, s.resident, len(job.feed),
                                 self._limit(s), s.residency)
                except KvresError as exc:
                    self.durability.fail(job, exc)
                    progressed = True
                    continue
                job.started = True
                self._share_prefix(job, s, busy, incoming)
                try:
                    self.recall.recall(job.session_id, len(job.feed), incoming)
                except Exception as exc:
                    self.durability.fail(job, exc)
                    progressed = True
                    continue
            n = min(self._want(job, s, incoming), capacity)
            if n <= 0:
                break
            try:
                if held is None or not self.pressure.fits(s, n, held + sum(incoming.values())):
                    # room for the whole chunk ahead (a generate plans ahead like an append would)
                    ahead = n if job.feed else self._ahead(job, s)
                    changed = self.pressure.make_room({**incoming, job.session_id: n},
                                                      ahead={job.session_id: ahead}, busy=busy)
                    held = None if changed else self.ctx.held()
            except BackendFullError as exc:
                if self._past_quota(s, n):  # a limit, not a wait: no other session holds what it lacks
                    self.durability.fail(job, exc)
                    progressed = True
                else:
                    progressed |= self._wait(job, exc, stalled)  # until a call that runs frees room, or past the wait
                continue
            except Exception as exc:
                self.durability.fail(job, exc)
                progressed = True
                continue
            self.ctx.room.granted(job)
            job.ran = True
            if job.feed:
                toks = job.feed[:n]
                finishing += n == len(job.feed)
            elif job.pending is not None:  # handed out when its prompt's pass ended
                toks, job.pending = [job.pending], None
            else:
                toks = [self._sample(job, s)]
                self._emit(job, toks[0])  # out before the decode: it is chosen, and the log takes it
            batch.append((job, toks))
            incoming[job.session_id] = n
            capacity -= n
        if not batch:
            # nothing runs, so no call will free room: the last waiting call that holds room gives it up
            return self._preempt(stalled) or progressed
        self._run(batch, incoming)
        return True

    def _priority(self, job: Job) -> int:
        s = self.ctx.sessions.get(job.session_id)
        return 0 if s is None else s.policy.priority

    def _past_quota(self, s: HostSession, n: int) -> bool:
        """The session alone, with ``n`` more tokens, holds more than its tenant's resident quota."""
        quota = quota_of(self.ctx, s.policy.tenant)
        limit = None if quota is None else quota.resident_tokens
        return limit is not None and s.resident + n > limit

    def _wait(self, job: Job, refusal: BackendFullError, stalled: list[Job]) -> bool:
        """The job got no room now: it waits in the room queue (``stalled``), or fails at once where
        the queue is full; True when it failed."""
        error = self.ctx.room.wait(job, refusal)
        if error is None:
            stalled.append(job)
            return False
        self.durability.fail(job, error)
        return True

    def _expire(self) -> bool:
        """Calls that waited for room past ``max_room_wait_s`` fail (with the retry-after hint)."""
        expired = self.ctx.room.expired()
        for job, error in expired:
            self.durability.fail(job, error)
        return bool(expired)

    def _preempt(self, stalled: list[Job]) -> bool:
        """When every call waits for room that only waiting calls hold (each session's call
        holds what it has and needs more), the last of them in the queue's order with a live
        session (never the first, never a pinned one) is parked mid-call, so the ones before it
        go on; it comes back when room frees. One that holds nothing frees nothing, and is left be
        (nothing ran perhaps only because a call that holds room waits for its stream's reader).
        True when one was parked."""
        ctx = self.ctx
        if ctx.store is None:
            return False
        pinned = pinned_sessions(ctx)
        for job in reversed(stalled[1:]):
            s = ctx.sessions.get(job.session_id)
            if s is not None and s.live and s.resident > 0 and job.session_id not in pinned:
                self.pressure.preempt(job.session_id)
                return True
        return False

    def _share_prefix(self, job: Job, s: HostSession, busy: set[str], incoming: dict[str, int]) -> None:
        """An empty session's first tokens that a live session already holds (a shared system
        prompt) are taken from it (``Executor.share_prefix``), not prefilled; the last one is
        always decoded (its logits start the turn). Where the engine cannot, or no room can be
        made, they are prefilled as usual."""
        ctx, sid = self.ctx, job.session_id
        if len(job.feed) <= SHARE_MIN_TOKENS or s.residency.planned_budget_tokens is not None or s.scored_now \
                or self.executor.token_log(sid):
            return
        feed = np.asarray(job.feed[:-1])
        best, source = 0, ""
        for other, o in ctx.sessions.items():
            log = self.executor.token_log(other) if other != sid and o.live and o.exact else []
            m = min(len(log), feed.size)
            if m >= max(best + 1, SHARE_MIN_TOKENS):
                differ = np.flatnonzero(np.asarray(log[:m]) != feed[:m])
                n = int(differ[0]) if differ.size else m
                best, source = (n, other) if n > best else (best, source)
        if best < SHARE_MIN_TOKENS:
            return
        try:
            self.pressure.make_room({**incoming, sid: best}, busy=busy | {source})
            self.executor.share_prefix(source, sid, best)
        except KvresError:
            return  # prefilled instead
        del job.feed[:best]
        ctx.refresh_resident(sid)
        s.peak = max(s.peak, s.resident)

    def _nothing_to_generate(self, job: Job, s: HostSession) -> bool:
        """A generate with nothing left to generate, or before any prompt, is finished here."""
        if job.kind != "generate" or job.feed or job.pending is not None or (
                job.remaining and s.last_logits is not None):
            return False
        if job.remaining == 0:  # max_tokens=0: answered (no tokens), and committed like any call
            complete(self.ctx, self.durability, job)
        else:
            job.finish(KvresError(f"session {job.session_id!r} has no tokens yet: append a prompt first"))
        return True

    def _limit(self, s: HostSession) -> int | None:
        return session_limit(self.ctx.config, self.executor, s.residency)

    def _at_limit(self, job: Job, s: HostSession) -> bool:
        """A generate whose session holds its context limit ends here, as at ``max_tokens``
        ("length"): no token can follow (its last one is in the log)."""
        if job.kind != "generate" or job.feed or job.done or job.pending is not None:
            return False  # (a token handed out goes in: it was sampled only below the limit)
        limit = self._limit(s)
        if limit is None or s.resident < limit:
            return False
        job.remaining = 0
        if not job.waits_for_reader():  # else committed once its reader took every token
            complete(self.ctx, self.durability, job)
        return True

    def _ahead(self, job: Job, s: HostSession) -> int:
        """What a generate plans room for at once: never past the session's context limit."""
        ahead = s.residency.ahead(job.remaining)
        limit = self._limit(s)
        return ahead if limit is None else max(1, min(ahead, limit - s.resident))

    def _admit(self, job: Job, busy: set[str], incoming: dict[str, int], stalled: list[Job]) -> bool:
        """Bring a suspended session in for its job if a slot and room can be had (an idle session
        may be suspended for it), counting what the jobs before it in this step bring; False while
        it waits for them (in the room queue: ``stalled``)."""
        ctx = self.ctx
        try:
            self.resumption.resume(job.session_id, None, busy=busy, incoming=incoming)
            ctx.count(job.session_id, "resumes")
            return True
        except BackendFullError as exc:
            self._wait(job, exc, stalled)
            return False
        except Exception as exc:
            job.finish(exc)
            return False

    def _sample(self, job: Job, s: HostSession) -> int:
        """The job's next token from the session's last logits (its first one primes the sampler
        with the log's last tokens, for the penalties)."""
        assert job.sampler is not None and s.last_logits is not None
        if job.start_length < 0:
            log = self.executor.token_log(job.session_id)
            job.start_length = len(log)
            job.sampler.prime(log[-PRIME_TOKENS:])
        token = job.sampler.sample(s.last_logits)
        if job.logprobs is not None:
            job.logprobs.append(job.sampler.logprob(s.last_logits, token))
        if job.top_logprobs is not None:
            assert job.request is not None
            job.top_logprobs.append(top_log_softmax(s.last_logits, job.request.sampling.top_logprobs))
        return token

    def _emit(self, job: Job, token: int) -> None:
        """The token is in the session: hand it out, and end the job where a stop rule says so."""
        assert job.sampler is not None
        job.sampler.accept(token)
        job.emit(token)
        stop = None if job.stop is None else job.stop.check(job.produced, self.executor.detokenize)
        if stop is not None:
            job.finish_reason, job.stopped_by = stop
            job.remaining = 0

    def _want(self, job: Job, s: HostSession, incoming: dict[str, int]) -> int:
        """The job's share of this step before the step's capacity: one token for a generate, a
        chunk for an append (a session cut to budget after each chunk gets at most the free room)."""
        if not job.feed:
            return 1
        want = s.residency.chunk(len(job.feed))
        if s.scored_now:
            want = min(want, max(1, self.ctx.free_tokens(incoming)))  # compress after each chunk
        return want

    def _score(self, job: Job, s: HostSession, done: bool) -> None:
        """After the job's share of a step: compress a scored session when its time has come (a
        prompt larger than the free room is ranked by its own last ``observation_window`` tokens,
        still to come); an accumulating ranking (H2O) takes the rows so far when the next step's
        would not fit one capture with them."""
        if s.scored_now and self.eviction.compress_now(s, job, done):
            lookahead = job.feed[-s.residency.observation_window:] if job.feed and not done else None
            self.eviction.compress(job.session_id, lookahead)
            return
        if done or s.ranking is None or not s.ranking.accumulates:
            return
        coming = min(len(job.feed), self.step_tokens) if job.feed else 1
        if s.ranking.pending_rows(len(self.executor.token_log(job.session_id))) + coming > SCORE_ROWS:
            self.eviction.observe(job.session_id)

    def _hand_out_first_tokens(self, prompts: list[tuple[Job, list[int]]], logits: list[np.ndarray]) -> None:
        """Each generate whose prompt ended in this step samples its first token from the prompt's
        logits and hands it out now, before the step's decodes run where the engine runs them apart
        (``append_many_first``), not when the next step starts; the session's next step decodes it
        (``Job.pending``). A prompt that fills its session's context limit gets none (it ends there)."""
        for (job, toks), lg in zip(prompts, logits, strict=True):
            if job.kind != "generate" or len(toks) < len(job.feed) or job.remaining <= 0 or job.done:
                continue
            s = self.ctx.sessions.get(job.session_id)
            if s is None:
                continue
            limit = self._limit(s)
            if limit is not None and s.resident + len(toks) >= limit:
                continue
            s.last_logits = lg
            try:
                token = self._sample(job, s)
            except Exception:  # the next step samples it again, and fails the call the usual way
                continue
            self._emit(job, token)
            job.pending = token

    def _run(self, batch: list[tuple[Job, list[int]]], incoming: dict[str, int]) -> None:
        """One ``append_many_first`` for the batch (its prompts first, their first tokens handed out
        as soon as their logits are in); then logits, counters, compression, completion."""
        ctx = self.ctx
        prompts = [(job, toks) for job, toks in batch if job.feed]
        batch = prompts + [(job, toks) for job, toks in batch if not job.feed]
        prompt_tokens = sum(len(toks) for _, toks in prompts)
        started = time.perf_counter()
        try:
            logits = self.executor.append_many_first(
                [(job.session_id, toks) for job, toks in prompts],
                [(job.session_id, toks) for job, toks in batch[len(prompts):]],
                lambda first: self._hand_out_first_tokens(prompts, first))
        except Exception as exc:
            for job, _ in batch:
                ctx.refresh_resident(job.session_id)
                self.durability.fail(job, exc)
            return
        seconds = time.perf_counter() - started
        ctx.jobs.profile.engine(seconds, sum(len(t) for _, t in batch))
        self.costs.observe(seconds, prompt_tokens, sum(1 for job, _ in batch if not job.feed))
        ctx.metrics.count_tokens(ctx.name, "generated", sum(1 for job, _ in batch if not job.feed))
        ctx.metrics.count_tokens(ctx.name, "prompt", prompt_tokens)  # a generate's prompt too
        ctx.peak_resident_tokens = max(ctx.peak_resident_tokens, sum(
            s.resident + incoming.get(sid, 0) for sid, s in ctx.sessions.items()))
        finished = False
        for (job, toks), lg in zip(batch, logits, strict=True):
            s = ctx.sessions[job.session_id]
            s.last_logits = lg
            s.resident += len(toks)
            s.peak = max(s.peak, s.resident)
            if job.feed:
                del job.feed[: len(toks)]
                done = not job.feed and (job.kind == "append" or (job.remaining == 0 and job.pending is None))
            else:
                done = job.remaining == 0
            try:
                self._score(job, s, done)
            except Exception as exc:
                self.durability.fail(job, exc)
            if done and not job.done and not job.waits_for_reader():  # else once its reader took them all
                complete(ctx, self.durability, job)
            finished |= job.done or job.committing
        if finished:
            ctx.publish()
