"""Recall: a spilling session's cold blocks brought back when a new turn attends to them.

Primitives:
- ``Recall(ctx, executor, eviction)``: ``recall(session_id, incoming)`` at the first step of an append (before
  the turn's tokens are prefilled, so they see what came back); ``prepare_recalls()``, the step
  loop's idle work: the cold blocks of the most recently used spilling session read ahead on a
  reader thread, without the host lock, and the part of the recall that needs no turn done
  (``Executor.prepare_recall``).

Two ways, by what the engine can do (docs/architecture.md, Recall): where it scores blocks it has
not imported (``Executor.recall_attention``) and the session ranks by an attention window, the
turn is decoded once in a scoring pass over the resident tokens and the cold blocks placed as if
recalled, ``plan_recall`` ranks both together and one ``exchange`` imports what it keeps and spills
what it drops (the append then takes the scoring pass's decode). Otherwise the newest blocks that
fit the free room are imported first and the session is compressed once after the append.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence

import numpy as np

from kvres.coldstore import ColdStoreError, KVBlock
from kvres.policy import BlockMismatchError, CapabilityError, KvresError, Range, RangeError
from kvres.policy.recall import plan_recall

from ..engines.executor import RECALL_PREP_BYTES, Executor
from .context import HostContext
from .eviction import Eviction
from .sessions import HostSession, RecallReady
from .store_ports import ColdRef, StorePort

log = logging.getLogger("kvres.backend")


class Recall:
    def __init__(self, ctx: HostContext, executor: Executor, eviction: Eviction) -> None:
        self.ctx = ctx
        self.executor = executor
        self.eviction = eviction
        self._reading = False  # a recall's cold blocks are being read ahead

    def recall(self, session_id: str, incoming: int, step: Mapping[str, int] | None = None) -> None:
        """A new turn of a spilling session brings back the cold blocks it attends to; the
        recalled blocks that stay rank first for the rest of the turn. ``incoming``: the turn's
        tokens; ``step``: what the jobs before it in this step bring (the room is what is left)."""
        ctx = self.ctx
        s = ctx.sessions[session_id]
        s.retrieved = []
        store = ctx.store
        if not (s.residency.spills and s.cold and store is not None) or s.ranking is None:
            return  # nothing to recall, or nothing could tell which recalled blocks matter
        executor = self.executor
        t0 = time.perf_counter()
        turn = next((job.feed for job in ctx.jobs.pending(session_id) if job.feed), None)
        if s.ranking.by_attention_window and turn:
            recalled = self._by_scoring_pass(session_id, s, executor, store, turn, incoming + sum((step or {}).values()))
            if recalled is not None:
                self._counted(session_id, recalled, t0)
                return
            if not s.cold:
                return
        imported = self._import_newest(session_id, s, executor, store, incoming + sum((step or {}).values()))
        if imported is not None:
            s.compressing, s.retrieved = True, imported
            self._counted(session_id, imported, t0)

    def _counted(self, session_id: str, recalled: list[Range], t0: float) -> None:
        ctx = self.ctx
        ctx.refresh_resident(session_id)
        ctx.count(session_id, "recalls", len(recalled))
        ctx.count(session_id, "recalled_tokens", sum(len(r) for r in recalled))
        ctx.count(session_id, "recall_us", int((time.perf_counter() - t0) * 1e6))

    def _by_scoring_pass(
        self, session_id: str, s: HostSession, executor: Executor, store: StorePort, turn: list[int], incoming: int,
    ) -> list[Range] | None:
        """The recall by a scoring pass over resident and cold blocks together; None where the
        engine could not score (the recall then imports first)."""
        assert s.ranking is not None
        r = s.residency
        resident = executor.resident_ranges(session_id)
        log_len = len(executor.token_log(session_id))
        refs, blocks = self._candidates(session_id, s, sum(len(x) for x in resident) + len(turn))
        try:
            capture = executor.recall_attention(session_id, blocks, turn, r.observation_window, r.rebase)
        except (KvresError, ColdStoreError, ValueError) as exc:
            log.debug("session %r: recall by import first (%s)", session_id, exc)
            return None
        cold = np.array([(ref.key.token_range.start, ref.key.token_range.end) for ref in refs], dtype=np.int64)
        choice = plan_recall(
            resident, cold.reshape(-1, 2), Range(log_len, log_len + len(turn)),
            s.ranking.scorer.score(capture), capture.key_positions, r.stream_policy(), r.block_size,
            r.budget_tokens or 0, executor.capabilities(), self.ctx.free_tokens({}) - incoming,
        )
        back = [refs[i] for i in choice.imports]
        if back or choice.evict:
            exported = executor.exchange(session_id, choice.evict, [blocks[i] for i in choice.imports], r.rebase)
            back_ids = {id(ref) for ref in back}
            s.cold = [ref for ref in s.cold if id(ref) not in back_ids]
            store.take(back)  # read above: this only removes them
            if exported:
                self.eviction.keep_spilled(session_id, store.park(exported), len(exported))
            self.ctx.count(session_id, "evictions", len(choice.evict))
            s.ranking.drop(choice.evict)
        s.retrieved = [ref.key.token_range for ref in back]
        return s.retrieved

    def _import_newest(
        self, session_id: str, s: HostSession, executor: Executor, store: StorePort, incoming: int,
    ) -> list[Range] | None:
        """The newest cold blocks that fit the free room, imported exactly (None: none fits)."""
        room = self.ctx.free_tokens({}) - incoming
        chosen: list[ColdRef] = []
        for ref in sorted(s.cold, key=lambda r: r.key.token_range.start, reverse=True):
            if len(ref.key.token_range) <= room:
                chosen.append(ref)
                room -= len(ref.key.token_range)
        if not chosen:
            return None
        taken = set(chosen)
        s.cold = [ref for ref in s.cold if ref not in taken]
        recalled: list[Range] = []
        for block in store.take(sorted(chosen, key=lambda r: r.key.token_range.start)):
            if block is None:
                continue
            try:
                executor.import_range(session_id, block)
            except (ColdStoreError, BlockMismatchError, RangeError, CapabilityError):
                continue
            recalled.append(block.token_range)
        return recalled

    # -- the cold blocks a scoring pass reads -------------------------------------------------
    def _candidates(self, session_id: str, s: HostSession, held: int) -> tuple[list[ColdRef], list[KVBlock]]:
        """The cold blocks a scoring pass over ``held`` more tokens has room for (the newest
        first), read from their stores (read, not taken: only the blocks brought back leave), in
        log order; blocks a store no longer has are dropped from the session. What the idle
        backend read for the session serves while its cold blocks are the same."""
        ready, s.recall_ready = s.recall_ready, None
        if ready is not None and ready.refs is not None and ready.cold == s.cold \
                and ready.tokens <= self.ctx.config.n_ctx - held:
            return ready.refs, ready.blocks
        candidates = self._picks(s, held)
        return self._keep_read(session_id, s, candidates, self.read_cold(candidates))

    def _picks(self, s: HostSession, held: int) -> list[ColdRef]:
        fits = self.ctx.config.n_ctx - held
        candidates: list[ColdRef] = []
        for ref in sorted(s.cold, key=lambda r: r.key.token_range.start, reverse=True):
            n = len(ref.key.token_range)
            if n <= fits:
                candidates.append(ref)
                fits -= n
        return candidates

    def read_cold(self, refs: Sequence[ColdRef]) -> list[KVBlock | None]:
        """The blocks behind ``refs`` (None where gone), one ``get_many`` per store."""
        store = self.ctx.store
        assert store is not None
        return store.read(refs)

    def _keep_read(
        self, session_id: str, s: HostSession, candidates: list[ColdRef], read: list[KVBlock | None],
    ) -> tuple[list[ColdRef], list[KVBlock]]:
        """The blocks read, in log order; those a store no longer has (dropped, or gone with its
        node) leave the session and are counted (``dropped_blocks``)."""
        store = self.ctx.store
        assert store is not None
        gone = [ref for ref, block in zip(candidates, read, strict=True) if block is None]
        if gone:
            lost = {id(ref) for ref in gone}
            s.cold = [ref for ref in s.cold if id(ref) not in lost]
            store.release(gone)
            self.ctx.count(session_id, "dropped_blocks", len(gone))
        kept = sorted(((candidates[i], block) for i, block in enumerate(read) if block is not None),
                      key=lambda pair: pair[0].key.token_range.start)
        return [ref for ref, _ in kept], [block for _, block in kept]

    # -- read ahead while idle ---------------------------------------------------------------
    def prepare_recalls(self) -> bool:
        """Idle work (the step loop calls it when no call runs): for the most recently used
        spilling session whose next turn would recall by a scoring pass, read its cold blocks on a
        reader thread, without the host lock (neither a control call nor the next step waits for a
        store's answer), and let the executor do the part of the recall that needs no turn. What
        was read is used only if the session did not change meanwhile; then the reader asks the
        loop for the next piece (``JobQueue.request_idle``). Returns False: the loop has nothing
        more to do itself."""
        ctx = self.ctx
        with ctx.lock:
            if ctx.store is None or ctx.jobs.pending() or self._reading:
                return False
            waiting = [(s.last_used, sid) for sid, s in ctx.sessions.items()
                       if s.live and s.cold and s.residency.spills
                       and s.ranking is not None and s.ranking.by_attention_window
                       and (s.recall_ready is None or s.recall_ready.used != s.last_used
                            or s.recall_ready.cold != s.cold)]
            if not waiting:
                return False
            session_id = max(waiting)[1]
            s = ctx.sessions[session_id]
            piece = (session_id, list(s.cold), s.last_used, self._picks(s, s.resident))
            self._reading = True
        threading.Thread(target=self._prepare_read, args=piece, name=f"kvres-recall-read-{ctx.name}",
                         daemon=True).start()
        return False

    def _prepare_read(self, session_id: str, cold: list[ColdRef], used: int, candidates: list[ColdRef]) -> None:
        """One piece of ``prepare_recalls``, on the reader thread."""
        ctx = self.ctx
        t0 = time.perf_counter()
        try:
            try:
                read: list[KVBlock | None] | None = self.read_cold(candidates)
            except Exception as exc:
                read = None
                log.debug("session %r: cold blocks not read ahead (%s)", session_id, exc)
            with ctx.lock:
                s = ctx.sessions.get(session_id)
                if ctx.jobs.stopping or s is None or not s.live or s.cold != cold \
                        or s.last_used != used or ctx.jobs.pending():
                    return  # it changed meanwhile (or a call runs): the loop looks again when idle
                self._prepare_from(session_id, s, candidates, read)
                ctx.count(session_id, "recall_prep_us", int((time.perf_counter() - t0) * 1e6))
        finally:
            with ctx.lock:
                self._reading = False
            ctx.jobs.request_idle()

    def _prepare_from(
        self, session_id: str, s: HostSession, candidates: list[ColdRef], read: list[KVBlock | None] | None,
    ) -> None:
        ctx = self.ctx
        try:
            if read is None:
                raise KvresError("cold blocks not read")
            refs, blocks = self._keep_read(session_id, s, candidates, read)
            self.executor.prepare_recall(session_id, blocks, s.residency.rebase)
            s.recall_ready = RecallReady(list(s.cold), s.last_used, refs, blocks,
                                         sum(len(r.key.token_range) for r in refs), sum(r.nbytes for r in refs))
        except Exception as exc:  # the turn does it all itself then
            log.debug("session %r: recall not prepared (%s)", session_id, exc)
            s.recall_ready = RecallReady(list(s.cold), s.last_used)
        # what the blocks read ahead may hold, all sessions together: the least recently used let go
        ready = sorted((x.recall_ready.used, x.recall_ready.nbytes, sid) for sid, x in ctx.sessions.items()
                       if x.recall_ready is not None and x.recall_ready.refs is not None)
        held = sum(nbytes for _, nbytes, _ in ready)
        for used_at, nbytes, sid in ready[:-1]:
            if held <= RECALL_PREP_BYTES:
                break
            held -= nbytes
            ctx.sessions[sid].recall_ready = RecallReady(list(ctx.sessions[sid].cold), used_at)
