"""How the host reaches a session's KV on its engine: the part that differs by the kind of engine,
below every part that opens, parks or brings back a session.

Primitives:
- ``SessionKV``: ``check_policy(policy, residency)`` (can this engine run it; at open),
  ``open_on_engine(session_id, s, tokens)``, ``export_resident(session_id, ranges) -> blocks``
  (the KV of resident ranges, for a suspend or a session file; none where it cannot be exported),
  ``restore(session_id, record) -> recomputed`` (a resumed session's parked blocks imported, the
  rest of its recorded resident ranges recomputed; a block that runs past a log cut while parked
  imported whole and cut back) and ``bring_back(session_id, s, layout)`` (a
  truncated session's resident layout at an earlier commit restored).
- ``AddressedKV(ctx, executor, recall_costs=None)``: the ``SessionKV`` of an engine whose KV kvres
  addresses range by range (an ``Executor``); ``recall_costs`` says which parked blocks are
  cheaper to recompute than to read. The engine that manages its KV itself has
  ``engine_managed.ManagedKV``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from kvres.coldstore import ColdStoreError, KVBlock
from kvres.policy import BlockMismatchError, CapabilityError, Range, RangeError, subtract_range
from kvres.policy.recall import RecallCosts
from kvres.policy.residency import Residency

from ..config import SessionPolicy
from ..engines.executor import Executor
from .admission import check_kv_policy, report_degraded
from .context import HostContext
from .sessions import HostSession, SuspendRecord


class SessionKV(Protocol):
    def check_policy(self, policy: SessionPolicy, residency: Residency) -> None: ...

    def open_on_engine(self, session_id: str, s: HostSession, tokens: Sequence[int]) -> None: ...

    def export_resident(self, session_id: str, ranges: Sequence[Range]) -> list[KVBlock]: ...

    def restore(self, session_id: str, record: SuspendRecord) -> int: ...

    def bring_back(self, session_id: str, s: HostSession, layout: tuple[Range, ...]) -> None: ...


def subtract_ranges(want: Range, have: list[Range]) -> list[Range]:
    parts = [want]
    for h in have:
        parts = [p for part in parts for p in subtract_range([part], h)]
    return parts


class AddressedKV:
    def __init__(self, ctx: HostContext, executor: Executor,
                 recall_costs: Callable[[], RecallCosts | None] | None = None) -> None:
        self.ctx = ctx
        self.executor = executor
        self._recall_costs = recall_costs

    def check_policy(self, policy: SessionPolicy, residency: Residency) -> None:
        check_kv_policy(self.ctx, policy, residency)

    def open_on_engine(self, session_id: str, s: HostSession, tokens: Sequence[int]) -> None:
        self.executor.open_session(session_id, tokens)
        report_degraded(self.ctx, session_id, s)

    def export_resident(self, session_id: str, ranges: Sequence[Range]) -> list[KVBlock]:
        if not ranges or not self.executor.capabilities().kv_export:
            return []
        return [self.executor.export_range(session_id, r) for r in ranges]

    def restore(self, session_id: str, record: SuspendRecord) -> int:
        """Import the parked blocks worth reading (one ``pop_many`` per store, which also frees
        them), recompute the rest from the token log."""
        ctx, executor = self.ctx, self.executor
        can_shift = executor.capabilities().position_shift
        # without position_shift, a recomputed range after a gap may be impossible: read every block
        costs = self._recall_costs() if self._recall_costs is not None and can_shift else None
        parked = ctx.store.take(record.blocks, costs) if ctx.store is not None and record.blocks else []
        overhang = self._open_with_overhang(session_id, record.token_log, parked)
        for block in parked:
            if block is None:
                continue  # gone, unreadable or cheaper to recompute: recomputed below
            try:
                executor.import_range(session_id, block)
                ctx.count(session_id, "admissions")
            except (ColdStoreError, BlockMismatchError, RangeError):
                continue
        recomputed = 0
        for rng in record.resident_ranges:
            missing = [rng]
            for have in executor.resident_ranges(session_id):
                missing = [m for part in missing for m in subtract_range([part], have)]
            for part in missing:
                try:
                    executor.admit_range(session_id, part)
                except CapabilityError:
                    if can_shift:
                        raise
                    continue  # it would need a K-shift: the range stays evicted, its tokens in the log
                recomputed += len(part)
        if overhang:
            executor.truncate(session_id, len(record.token_log))  # the block's part past the log goes
        if recomputed:
            ctx.count(session_id, "recomputed_tokens", recomputed)
        return recomputed

    def _open_with_overhang(self, session_id: str, log: Sequence[int], parked: list[KVBlock | None]) -> bool:
        """A parked block that runs past the log (the log was cut while parked, ``Editing.truncate``)
        is imported whole, the session's log lengthened by the block's own tokens until the import
        is cut back: a few tokens read and dropped instead of the whole block recomputed. Only where
        every parked block came back and the block agrees with the log up to its end; otherwise the
        block is left out (its part of the log recomputed). True when the log was lengthened."""
        over = [i for i, block in enumerate(parked) if block is not None and block.token_range.end > len(log)]
        if not over:
            return False
        block = parked[over[0]]
        assert block is not None
        start = block.token_range.start
        usable = (len(over) == 1 and None not in parked and start < len(log)
                  and list(block.token_ids[: len(log) - start]) == list(log[start:]))
        if not usable:
            for i in over:
                parked[i] = None
            return False
        self.executor.close_session(session_id)
        self.executor.open_session(session_id, [*log, *block.token_ids[len(log) - start:]])
        return True

    def bring_back(self, session_id: str, s: HostSession, layout: tuple[Range, ...]) -> None:
        """What the dropped tokens made the session evict comes back, as it was resident when the
        log ended where it ends now: spilled blocks imported, the rest recomputed from the log."""
        ctx, executor = self.ctx, self.executor
        missing = [m for want in layout for m in subtract_ranges(want, executor.resident_ranges(session_id))]
        if not missing or sum(len(m) for m in missing) > ctx.free_tokens({}):
            return  # all there, or it would not fit the backend's budget now: the tokens stay evicted
        wanted = [ref for ref in s.cold if any(m.start <= ref.key.token_range.start and ref.key.token_range.end <= m.end
                                                 for m in missing)]
        if wanted and ctx.store is not None:
            taken = set(wanted)
            s.cold = [ref for ref in s.cold if ref not in taken]
            for block in ctx.store.take(sorted(wanted, key=lambda r: r.key.token_range.start)):
                if block is not None:
                    executor.import_range(session_id, block)
        for want in layout:
            for part in subtract_ranges(want, executor.resident_ranges(session_id)):
                executor.admit_range(session_id, part)
                ctx.count(session_id, "recomputed_tokens", len(part))
