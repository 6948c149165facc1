"""One backend: an executor (one engine instance) and the sessions on it, kept under budget.

Primitives:
- ``BackendHost(config, executor, plan=plan_backend, store=None, metrics=None, recall_costs=None,
  on_change=None, journal=None, file_secret=None, model_id="", on_expired=None,
  tier_decision=None)``: a plain, thread-safe class (works without Ray), the facade over the
  host's parts, which it builds in the order they depend on each other, each given what it needs.
  ``tier_decision`` (T*'s, ``kvres.actors.backend_setup.kv_config.resolve_kv_tier``): where it spills, a
  session opened or handed over with nothing for kvres to evict runs as a spilling session bounded
  by the resident budget (``kvres.actors.sizing.tier_policy.session_policy_for_tier``).
  ``open_session``, ``append``, ``append_text``, ``generate``, ``stream``, ``suspend``,
  ``resume``, ``detach``, ``close``, ``session_stats``, ``tenant_of``, ``stats``, ``sessions``,
  ``token_count``, ``load``; for chat and agents: ``chat``, ``chat_stream``, ``close_reply``,
  ``append_messages``, ``pause_for_tools``, ``tokens``, ``cancel``, ``truncate``, ``fork``,
  ``export``, ``restore``;
  the model's ``tokenize``, ``detokenize``; ``shutdown()``: the host stops (its retention timer
  and step loop, pending calls failing with ``LoopStoppedError``) and its engine is freed.
  ``generate`` / ``stream`` take a ``prompt``: tokens appended in the same call (one job, one
  commit; the first token comes in the step after the prompt's last chunk); ``stream`` takes a
  chat turn's ``messages`` instead, and ``ephemeral=True`` (with a ``policy``) for a stateless turn:
  its session opened in the call, never written to the journal, closed when the stream ends or is
  left. ``stream`` / ``chat_stream`` return a ``TokenStream``: its job
  runs at most ``STREAM_AHEAD`` tokens past what its reader took and is committed once the reader
  took them all; ``close()`` leaves it, keeping what it handed out. The operations a backend
  serves are declared once, in ``kvres.actors.host.backend_surface`` (``BackendSurface``), and
  mypy checks this class against it.
- ``BackendFullError``, ``SessionBusyError``: typed refusals; ``SuspendRecord``: what brings a
  session back on any backend of the same model.

The parts (``kvres.actors.host``), in the order they are built: ``context`` (the session table,
rebuilt from the journal on first use, the lock, the pending calls), ``durability`` (journal
commit, roll back), the engine's side: ``kv_access.AddressedKV`` and ``eviction`` (eviction, spill
caps, compression) where kvres addresses the engine's KV, ``engine_managed.ManagedKV`` where the
engine evicts by itself (what needs an addressed engine is refused there); then ``parking``
(suspend), ``pressure`` (room-making), ``resumption`` (resume), ``editing``, ``chat``,
``portable``, ``spill_recall`` and ``stepper`` (the step for engines whose KV kvres addresses) or
``engine_managed.ManagedStepper``, ``retention`` (priorities and pins in who goes first; idle
sessions parked and expired ones closed, then ``on_expired(session_id)``), ``tool_pauses``
(sessions waiting for tool results; the loop's idle work brings parked ones back), and last the step loop
(``scheduler``). Also ``sessions`` (a session and its explicit state), ``admission`` (policy checks
at open), ``stats``.

Calls of different sessions run concurrently: ``append`` / ``generate`` / ``stream`` become jobs of
a ``StepLoop`` (``kvres.actors.host.scheduler``) whose every step decodes the next token of every
generating session plus prefill chunks of appending ones in one ``append_many``. Control calls take
the same lock and so wait at most one step. A session's token log is the source of truth: no
failure on the way loses tokens; missing KV is recomputed from the log.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kvres.policy import SessionExistsError, UnknownSessionError
from kvres.policy.backend_planner import BackendPlan, BackendPlanInput, plan_backend
from kvres.policy.capacity import LayerKVProfile
from kvres.policy.recall import RecallCosts
from kvres.policy.tiering import TierDecision
from kvres.policy.tokens import TokenIdError, token_ids

from ..config import BackendConfig, SessionPolicy
from ..engines.executor import EngineManagedExecutor, Executor
from ..generation import Generation, GenerationRequest, StopRule
from ..metrics import COUNTERS, Metrics, NullMetrics
from ..sampling import SamplingParams
from ..sizing.tier_policy import session_policy_for_tier
from .chat import Chat, ChatPlan
from .context import HostContext
from .durability import Durability
from .editing import Editing
from .engine_managed import ManagedKV, ManagedStepper
from .eviction import Eviction
from .journal import Journal, SessionRecord
from .kv_access import AddressedKV, SessionKV
from .parking import Parking
from .portable import Portable
from .pressure import Evictor, Pressure
from .refusals import BackendFullError, SessionBusyError
from .resumption import Resumption
from .retention import RetentionTimer
from .scheduler import STREAM_AHEAD, Job, StepLoop
from .sessions import SuspendRecord
from .spill_recall import Recall
from .stats import backend_stats, session_stats
from .stepper import KVStepper
from .store_ports import StorePort
from .tool_pauses import ToolPauses

if TYPE_CHECKING:
    from .backend_surface import BackendSurface


class TokenStream:
    """A streaming generate: iterate for its tokens (or ``next_chunk()`` for every token out by
    then, in one list: read one way or the other); ``generation`` is its answer once it ended. A
    token counts as read when the reader asks for the next one (the Ray shell asks once its driver
    took it): the job runs at most ``STREAM_AHEAD`` tokens past what was read, and is committed
    once every token was read. ``close(keep=None)`` (or leaving a ``with`` block) ends the call
    with only its first ``keep`` tokens committed (what it handed out when None)."""

    def __init__(self, job: Job, wake: Callable[[], None], leave: Callable[[int], object],
                 ended: Callable[[], None] | None = None) -> None:
        self.job = job
        self._tokens = job.tokens()
        self._chunks = job.chunks()
        self._wake = wake  # the step loop's: a job waiting for its reader goes on
        self._leave = leave
        self._ended = ended  # called once the stream ended, read to its end or left (an ephemeral session closed)
        self.handed_out = 0
        self._unread = 0  # the tokens handed out last are not counted read until more are asked for

    def __iter__(self) -> TokenStream:
        return self

    def __next__(self) -> int:
        self._count_read()
        try:
            token = next(self._tokens)
        except BaseException:
            self._end()
            raise
        self.handed_out += 1
        self._unread = 1
        return token

    def next_chunk(self) -> list[int]:
        """The tokens out, in one list (``Job.chunks``: the first waits for one token, later ones for
        ``CHUNK_TOKENS`` or the last); ``StopIteration`` at the end."""
        self._count_read()
        try:
            chunk = next(self._chunks)
        except BaseException:
            self._end()
            raise
        self.handed_out += len(chunk)
        self._unread = len(chunk)
        return chunk

    def _end(self) -> None:
        ended, self._ended = self._ended, None
        if ended is not None:
            ended()

    def _count_read(self) -> None:
        if self._unread:
            self.job.took(self._wake, self._unread)
            self._unread = 0

    def __enter__(self) -> TokenStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, keep: int | None = None) -> None:
        """Leave the stream: the call ends now with its first ``keep`` tokens (all it handed out
        when None) committed (``BackendHost.cancel``); nothing happens once it has ended."""
        try:
            if not self.job.done:
                self._leave(self.handed_out if keep is None else keep)
        finally:
            self._end()

    @property
    def generation(self) -> Generation | None:
        answer = self.job.answer
        return answer if isinstance(answer, Generation) else None


class BackendHost:
    def __init__(
        self,
        config: BackendConfig,
        executor: Executor | EngineManagedExecutor,
        plan: Callable[[BackendPlanInput], BackendPlan] = plan_backend,
        store: StorePort | None = None,
        metrics: Metrics | None = None,
        recall_costs: Callable[[], RecallCosts | None] | None = None,
        on_change: Callable[[], None] | None = None,
        journal: Journal | None = None,
        file_secret: bytes | None = None,
        model_id: str = "",
        on_expired: Callable[[str], None] | None = None,
        tier_decision: TierDecision | None = None,
    ) -> None:
        ctx = self._ctx = HostContext(config, executor, store, metrics or NullMetrics(), journal, on_change)
        self.config, self.name, self.executor, self.fingerprint = config, config.name, executor, executor.fingerprint
        self._store = store
        self._tier_decision = tier_decision
        self._durability = Durability(ctx)
        self._engine: KVStepper | ManagedStepper
        prepare_recalls: Callable[[], bool] | None = None
        if isinstance(executor, Executor):  # kvres evicts, spills and recalls its KV
            eviction = Eviction(ctx, executor, plan)
            self._build_parts(AddressedKV(ctx, executor, recall_costs), eviction, plan, file_secret, model_id)
            recall = Recall(ctx, executor, eviction)
            self._engine = KVStepper(ctx, executor, self._durability, self._pressure, eviction, recall,
                                     self._resumption)
            prepare_recalls = recall.prepare_recalls
        else:  # the engine manages its KV: what needs kvres to address it is refused
            managed = ManagedKV(ctx, executor)
            self._build_parts(managed, managed, plan, file_secret, model_id)
            self._engine = ManagedStepper(ctx, executor, self._durability, self._resumption)
        self._retention = RetentionTimer(ctx, functools.partial(self._parking.suspend, forced=False), on_expired)
        pauses = self._tool_pauses = ToolPauses(ctx, self._resumption,
                                                lambda n, tenant: not self._pressure.needs_plan({}, n, tenant))

        def idle_work() -> bool:  # sessions paused for tools first: their results are coming
            return pauses.prefetch() or (prepare_recalls is not None and prepare_recalls())

        pause_probes = self._pause_probes = getattr(recall_costs, "pause", None)  # a probe child waits out the calls

        def on_busy(busy: bool) -> None:
            if not busy:
                ctx.room.prune()  # calls that ended while they waited for room (closed, cancelled)
            if store is not None:
                store.defer_writes(busy)
            if pause_probes is not None:
                pause_probes(busy)

        # built last: its step runs the parts above
        self._loop = StepLoop(ctx.lock, self._step, config.name, on_busy=on_busy, on_idle=idle_work,
                              on_start=executor.claim_decode_threads, jobs=ctx.jobs)
        # the engine's multi-threaded decodes belong to the step loop's thread (see
        # kvres.actors.engines.llama.decode_threads): other threads decode on one thread until it has started
        executor.reserve_decode_threads()
        self._kv_profile: LayerKVProfile | None = None
        self._kv_profile_read = False

    def _build_parts(self, kv: SessionKV, evictor: Evictor, plan: Callable[[BackendPlanInput], BackendPlan],
                     file_secret: bytes | None, model_id: str) -> None:
        """The parts every host has, over its engine's side (``kv``, ``evictor``), in the order
        they depend on each other."""
        ctx, durability = self._ctx, self._durability
        self._kv = kv
        self._parking = Parking(ctx, durability, kv)
        self._pressure = Pressure(ctx, plan, self._parking, evictor)
        self._resumption = Resumption(ctx, durability, self._pressure, kv)
        self._editing = Editing(ctx, durability, self._pressure, self._resumption, kv)
        self._chat = Chat(ctx)
        self._portable = Portable(ctx, durability, self._resumption, kv, file_secret, model_id)

    @property
    def peak_resident_tokens(self) -> int:
        """The most the engine held after any step."""
        return self._ctx.peak_resident_tokens

    def _step(self, jobs: list[Job]) -> bool:
        """One engine step for ``jobs`` (under the lock). A call that fails is rolled back;
        sessions others' calls changed are committed after the step."""
        try:
            return self._engine.step(jobs)
        except BaseException as exc:  # a bug in a step must not leave a call half applied
            for job in jobs:
                self._durability.fail(job, exc)
            return True
        finally:
            self._durability.flush_dirty()

    # -- reading ------------------------------------------------------------------------------
    def load(self) -> tuple[int, int, int]:
        """(resident tokens, live sessions, suspended sessions), read under the lock."""
        with self._ctx.lock:
            live = sum(1 for s in self._ctx.sessions.values() if s.live)
            return self._ctx.held(), live, len(self._ctx.sessions) - live

    def sessions(self) -> list[str]:
        with self._ctx.lock:
            return list(self._ctx.sessions)

    def token_count(self, session_id: str) -> int:
        with self._ctx.lock:
            return len(self._ctx.token_log(session_id))

    def tokens(self, session_id: str) -> list[int]:
        """The session's token log: every token it was given and generated, in order."""
        with self._ctx.lock:
            return list(self._ctx.token_log(session_id))

    def session_stats(self, session_id: str) -> dict[str, Any]:
        with self._ctx.lock:
            return session_stats(self._ctx, session_id)

    def tenant_of(self, session_id: str) -> str | None:
        """The tenant of the session's policy, fixed when it opened (read without the lock where held)."""
        if (s := self._ctx.sessions.get(session_id)) is None:
            with self._ctx.lock:
                s = self._ctx.get(session_id, live=False)
        return s.policy.tenant

    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        return self.executor.tokenize(text, add_bos, special)

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        return self.executor.detokenize(tokens, special)

    def stats(self) -> dict[str, Any]:
        with self._ctx.lock:
            if not self._kv_profile_read:  # read once, when first asked (it reads the model file)
                self._kv_profile, self._kv_profile_read = self.executor.kv_profile(), True
            return backend_stats(self._ctx, self._kv_profile)

    # -- session lifecycle ----------------------------------------------------------------------
    def open_session(self, session_id: str, policy: SessionPolicy | None = None) -> None:
        self._open(session_id, policy)

    def _open(self, session_id: str, policy: SessionPolicy | None, ephemeral: bool = False) -> None:
        """``ephemeral``: for one call, which closes it; never in the journal (not looked for there)."""
        ctx = self._ctx
        policy = self._policy_here(policy)
        with ctx.lock:
            if session_id in ctx.sessions or (not ephemeral and ctx.journal.load(session_id) is not None):
                raise SessionExistsError(session_id)
            s = ctx.new_session(policy)
            s.ephemeral = ephemeral
            self._kv.check_policy(policy, s.residency)
            try:
                self._pressure.make_room({}, newcomer=session_id)
            except BackendFullError:
                if ctx.store is None:
                    raise
                # every slot serves a running call: the session starts suspended (holding no
                # engine slot) and comes in as soon as one frees
                s.park(SessionRecord(session_id, [], [], [], [], policy, None, dict.fromkeys(COUNTERS, 0),
                                     ctx.fingerprint))
            else:
                self._kv.open_on_engine(session_id, s, ())
            ctx.sessions[session_id] = s
            self._durability.commit_new(session_id)
            ctx.publish()

    def _policy_here(self, policy: SessionPolicy | None) -> SessionPolicy:
        """What a session runs as here: where T* chose to spill, one with nothing for kvres to evict
        keeps a resident window and parks the rest in the cold store (``session_policy_for_tier``)."""
        return session_policy_for_tier(self._tier_decision, policy, self.config.kv_budget_tokens)

    def close(self, session_id: str) -> None:
        """Close the session, ending a call it has running (that call raises ``SessionBusyError``)."""
        self._ctx.close(session_id)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop the retention timer and the step loop (once the step under way is done; pending
        calls fail with ``LoopStoppedError``), then free the engine. The host takes no call after."""
        self._retention.stop()
        self._loop.stop(timeout_s)
        with contextlib.suppress(Exception):  # calls answered once written: written now (a failure fails them)
            self._ctx.journal.flush()
        if self._pause_probes is not None:  # a probe child left stopped by the last calls goes on
            self._pause_probes(False)
        if callable(close := getattr(self.executor, "close", None)):  # an engine holding native memory frees it
            close()

    def pause_for_tools(self, session_id: str) -> None:
        """The session's last turn ended in tool calls: kept over idle sessions until its next call
        (within its ``tool_pause_s``), and brought back ahead of it if it had to be parked."""
        self._tool_pauses.pause(session_id)

    def suspend(self, session_id: str) -> SuspendRecord:
        """Export all of the session's KV to the cold store and free it on the engine (a session
        already suspended stays as it is); a caller's: not counted in ``suspends`` (forced ones only)."""
        return self._parking.suspend(session_id, forced=False)

    def detach(self, session_id: str) -> SuspendRecord:
        """Suspend and forget the session here (it moves to another backend)."""
        return self._parking.detach(session_id)

    def resume(self, session_id: str, record: SuspendRecord | None = None) -> int:
        """Bring a suspended session back (from this backend's record or one handed over: it runs with
        the policy it would have been opened with here); returns how many tokens were recomputed."""
        if record is not None:
            policy = self._policy_here(record.policy)
            record = record if policy is record.policy else replace(record, policy=policy)
        with self._ctx.lock:
            return self._resumption.resume(session_id, record)

    # -- editing the history ---------------------------------------------------------------------
    def cancel(self, session_id: str, request_id: str | None = None, keep: int | None = None) -> Generation | None:
        """End a running generate early, keeping its first ``keep`` tokens (``Editing.cancel``)."""
        return self._editing.cancel(session_id, request_id, keep)

    def truncate(self, session_id: str, length: int) -> int:
        """Drop the log's tokens past ``length`` and their KV, as if never appended."""
        return self._editing.truncate(session_id, length)

    def fork(self, source_id: str, new_id: str) -> None:
        """A new session here from ``source_id``'s state; both continue independently."""
        self._editing.fork(source_id, new_id)

    def export(self, session_id: str) -> bytes:
        """The session as one authenticated file's bytes (log, policy, logits, KV); it runs on."""
        return self._portable.export(session_id)

    def restore(self, data: bytes, session_id: str | None = None) -> tuple[str, int]:
        """A new session from ``export``'s bytes: (its id, tokens recomputed bringing it in)."""
        return self._portable.restore(data, session_id)

    # -- chat -----------------------------------------------------------------------------------
    def append_messages(
        self, session_id: str, messages: Sequence[Mapping[str, Any]], request_id: str | None = None,
    ) -> int:
        """Render the conversation with the model's chat template and append what the session does
        not hold yet (the generation prompt included); returns how many tokens were appended."""
        keep, new = self._chat.plan(session_id, messages)
        if keep < self.token_count(session_id):
            self.truncate(session_id, keep)
        if new:
            self.append(session_id, new, request_id)
        return len(new)

    def chat(
        self, session_id: str, messages: Sequence[Mapping[str, Any]], request: int | GenerationRequest = 256,
        request_id: str | None = None,
    ) -> Generation:
        """``append_messages`` then ``generate``, as one call: the assistant's reply
        (``Generation.text``), ending at the model's end-of-generation token by default;
        ``prompt_tokens`` says what was appended."""
        job = self._chat_job(session_id, messages, request, request_id, streaming=False)
        job.wait()
        reply = job.answer
        assert isinstance(reply, Generation)
        if reply.prompt_tokens is None:
            reply.prompt_tokens = 0
        self._close_reply(session_id, messages, reply, request_id)
        return reply

    def chat_stream(
        self, session_id: str, messages: Sequence[Mapping[str, Any]], request: int | GenerationRequest = 256,
        request_id: str | None = None,
    ) -> TokenStream:
        """``chat`` as a stream: the reply's first token comes right after the new turn's prompt is
        in. A reply that ends at the model's end-of-generation token is closed as the template
        closes it once the stream ends (``close_reply``)."""
        return self._stream_of(self._chat_job(session_id, messages, request, request_id, streaming=True))

    def _chat_job(self, session_id: str, messages: Sequence[Mapping[str, Any]], request: int | GenerationRequest,
                  request_id: str | None, streaming: bool) -> Job:
        """A turn's job, planned on the session's last committed log outside the lock (the steps go
        on meanwhile: rendering and tokenizing a long conversation takes milliseconds), then checked
        against the log and submitted under one hold of it: a turn waits once for the step under way.
        (An engine that samples itself gets the prompt by an append first, which waits for the loop:
        there the lock is not held.)"""
        joins = self._engine.joins_prompts
        planned = self._chat.plan_ahead(session_id, messages) if joins else None
        with self._ctx.lock if joins else contextlib.nullcontext():
            prompt = self._chat_prompt(session_id, messages, request_id, planned)
            return self._generate_job(session_id, request, 0.0, None, streaming, request_id, prompt,
                                      ahead=STREAM_AHEAD if streaming else None)

    def _chat_prompt(self, session_id: str, messages: Sequence[Mapping[str, Any]], request_id: str | None,
                     planned: ChatPlan | None = None) -> list[int]:
        """What the session lacks of the rendered conversation (the log cut back to where they agree)."""
        with self._ctx.lock:
            done = self._ctx.get(session_id, live=False).committed
            if request_id is not None and done is not None and done.request_id == request_id:
                return []  # a retry of a turn that committed: its answer is replayed
        keep, new, held = self._chat.plan_checked(session_id, messages, planned)
        if keep < held:
            self.truncate(session_id, keep)
        return new

    def close_reply(self, session_id: str, messages: Sequence[Mapping[str, Any]], reply: Generation,
                    request_id: str | None = None) -> None:
        """After a chat turn that ended at end-of-generation: append what the chat template puts
        after a reply, so the log reads as the conversation rendered with it."""
        self._close_reply(session_id, messages, reply, request_id)

    def _close_reply(self, session_id: str, messages: Sequence[Mapping[str, Any]], reply: Generation,
                     request_id: str | None) -> None:
        if reply.finish_reason == "eos" and reply.text is not None:
            # the reply closed as the template closes it, so the log is the rendered conversation
            closed = [*messages, {"role": "assistant", "content": reply.text}]
            keep, tail = self._chat.plan(session_id, closed, add_generation_prompt=False)
            if keep == self.token_count(session_id) and tail:
                self.append(session_id, tail, None if request_id is None else f"{request_id}:close")

    # -- tokens in and out (jobs of the step loop) ------------------------------------------------
    def _submit(self, job: Job) -> Job:
        ctx = self._ctx
        with ctx.lock:
            s = ctx.get(job.session_id, live=False)
            if ctx.jobs.pending(job.session_id):
                raise SessionBusyError(f"session {job.session_id!r} already has a call running")
            s.last_used, s.touched_at, s.tool_paused_at = ctx.tick(), time.monotonic(), None
            done = s.committed
            if job.request_id is not None and done is not None and done.request_id == job.request_id:
                job.replay(done.result)  # a retry of a call that committed: its answer, not a rerun
                return job
            if not s.live and s.parked is not None and s.parked.blocks and ctx.store is not None:
                ctx.store.prefetch(s.parked.blocks)  # read while the steps before its resume run
            return self._loop.submit(job)

    def append(self, session_id: str, tokens: Sequence[int], request_id: str | None = None) -> int:
        """Append tokens (prefilled in chunks that fit the budget); returns the log length. All of
        them are committed or none; a call repeated with the same ``request_id`` after it committed
        returns its answer without appending again."""
        toks = token_ids(tokens, self.executor.n_vocab)
        if not toks:
            raise TokenIdError("append needs at least one token id, got an empty sequence")
        return self._submit(Job(session_id, "append", feed=toks, appended=len(toks), request_id=request_id)).wait()

    def _prompt_first(self, session_id: str, prompt: Sequence[int] | None, request_id: str | None) -> tuple[list[int], int]:
        """A generate's prompt, checked: (what its own job feeds, how many tokens it appends). The
        job feeds it where the engine's KV is kvres's; an engine that samples itself takes whole
        calls, so there it is appended first."""
        toks = [] if prompt is None else token_ids(prompt, self.executor.n_vocab)
        if toks and not self._engine.joins_prompts:
            self.append(session_id, toks, None if request_id is None else f"{request_id}:prompt")
            return [], len(toks)
        return toks, len(toks)

    def append_text(self, session_id: str, text: str, request_id: str | None = None) -> list[int]:
        """Tokenize ``text`` (with BOS when the session is still empty) and append it; returns the
        token ids. A call repeated with the same ``request_id`` after it committed returns the ids
        it appended (read from the session's log), not a new tokenization."""
        ctx = self._ctx
        with ctx.lock:
            done = ctx.get(session_id, live=False).committed
            if request_id is not None and done is not None and done.request_id == request_id \
                    and isinstance(done.result, tuple):
                start, end = done.result
                return list(done.token_log[start:end])
            add_bos = not ctx.token_log(session_id)
        tokens = self.executor.tokenize(text, add_bos)
        self.append(session_id, tokens, request_id)
        return tokens

    def stream(
        self, session_id: str, request: int | GenerationRequest, request_id: str | None = None,
        prompt: Sequence[int] | None = None, messages: Sequence[Mapping[str, Any]] | None = None, *,
        temperature: float = 0.0, seed: int | None = None, ephemeral: bool = False,
        policy: SessionPolicy | None = None,
    ) -> TokenStream:
        """Tokens as they are produced, at most ``STREAM_AHEAD`` past what its reader took;
        committed once the reader took them all (or, when it is left, up to what ``cancel`` /
        ``TokenStream.close`` says was delivered). ``prompt``: tokens appended first, in the same
        call; ``messages``: a chat turn instead (``chat_stream``). ``temperature`` / ``seed``: the
        sampling of a ``request`` given as just ``max_tokens`` (without ``messages``).
        ``ephemeral``: a stateless turn: the session is opened here (with ``policy``), never
        written to the journal, and closed when the stream ends or is left."""
        if ephemeral:
            self._open(session_id, policy, ephemeral=True)
            try:
                stream = self.stream(session_id, request, request_id, prompt, messages, temperature=temperature,
                                     seed=seed)
            except BaseException:
                self._ctx.close(session_id)
                raise
            stream._ended = functools.partial(self._close_ephemeral, session_id)
            return stream
        if messages is not None:
            return self.chat_stream(session_id, messages, request, request_id)
        return self._stream_of(self._generate_job(session_id, request, temperature, seed, True, request_id, prompt,
                                                  ahead=STREAM_AHEAD))

    def _close_ephemeral(self, session_id: str) -> None:
        with contextlib.suppress(UnknownSessionError):  # closed meanwhile (the backend shutting down)
            self._ctx.close(session_id)

    def _stream_of(self, job: Job) -> TokenStream:
        return TokenStream(job, self._loop.poke, lambda keep: self.cancel(job.session_id, job.request_id, keep))

    def generate(
        self, session_id: str, request: int | GenerationRequest, request_id: str | None = None,
        prompt: Sequence[int] | None = None, *, temperature: float = 0.0, seed: int | None = None,
    ) -> Generation:
        """Generate until an end-of-generation token, a stop id or string, or ``max_tokens``
        (``request``: a ``GenerationRequest``, or just ``max_tokens``, sampled with ``temperature``
        and ``seed``); like an append, all of the tokens are committed or none. ``prompt``: tokens
        appended first, in the same call and commit (``prompt_tokens`` of the answer counts them)."""
        job = self._generate_job(session_id, request, temperature, seed, False, request_id, prompt)
        job.wait()
        assert isinstance(job.answer, Generation)
        return job.answer

    def _generate_job(
        self, session_id: str, request: int | GenerationRequest, temperature: float, seed: int | None,
        streaming: bool, request_id: str | None, prompt: Sequence[int] | None = None, ahead: int | None = None,
    ) -> Job:
        if not isinstance(request, GenerationRequest):
            request = GenerationRequest(max_tokens=request, sampling=SamplingParams(temperature=temperature, seed=seed))
        sampler = self._engine.sampler(request.sampling)
        stop = StopRule.of(request, self.executor.end_of_generation())
        feed, appended = self._prompt_first(session_id, prompt, request_id)
        return self._submit(Job(session_id, "generate", feed=feed, appended=appended, remaining=request.max_tokens,
                                sampler=sampler, streaming=streaming, request_id=request_id, request=request,
                                stop=stop, logprobs=[] if request.sampling.wants_logprobs else None,
                                top_logprobs=[] if request.sampling.top_logprobs else None, ahead=ahead))


if TYPE_CHECKING:
    def _declared(host: BackendHost) -> BackendSurface[TokenStream, tuple[str, int]]:
        return host  # mypy checks the host's operations against their declaration


__all__ = ["BackendFullError", "BackendHost", "Generation", "GenerationRequest", "SessionBusyError", "SuspendRecord"]
