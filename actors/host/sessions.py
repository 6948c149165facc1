"""A session as the backend host holds it, with its state as an explicit value.

Primitives:
- ``SessionState``: ``LIVE`` (its KV on the engine), ``SUSPENDED`` (parked: ``HostSession.parked``
  holds the record resume brings back) or ``PREEMPTED`` (parked for others' room while a call of
  its own waits for room: its record holds what that call did so far and is not committed; the
  call resumes it and then commits, or fails and rolls it back).
- ``HostSession``: the session's policy and residency object (built once at open), its ranking
  (with any running scoring state), counters, cold blocks (``cold_bytes``), last logits, resident
  and peak tokens, its last commit, where its last chat render left its log (``prefix_break``),
  when its last turn ended in tool calls (``tool_paused_at``, ``paused_for_tools(now)``);
  ``park(record)`` / ``record`` (the parked record).
- ``RecallReady``: a spilling session's cold blocks as read ahead for its next recall.
- ``SuspendRecord``: what a suspend hands over (the session's journal record).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
import numpy.typing as npt

from kvres.coldstore import KVBlock
from kvres.policy import Range
from kvres.policy.backend_planner import tool_pause_holds
from kvres.policy.residency import Ranking, Residency

from ..config import SessionPolicy
from ..metrics import COUNTERS
from .journal import SessionRecord
from .store_ports import ColdRef

SuspendRecord = SessionRecord
LAYOUTS_KEPT = 32  # commit points a rollback can return a session's resident layout to


class SessionState(Enum):
    LIVE = "live"
    SUSPENDED = "suspended"
    PREEMPTED = "preempted"


@dataclass(frozen=True)
class RecallReady:
    """A spilling session's cold blocks as read for its next recall (while the backend was
    idle): ``refs`` and their ``blocks`` (``tokens`` of them, ``nbytes``), valid while ``cold`` is
    its list; prepared again after any call of the session (``used``: its ``last_used`` then).
    ``refs`` None: considered and not held (it failed, or others were more recent)."""

    cold: list[ColdRef]
    used: int
    refs: list[ColdRef] | None = None
    blocks: list[KVBlock] = field(default_factory=list)
    tokens: int = 0
    nbytes: int = 0


@dataclass
class HostSession:
    policy: SessionPolicy
    residency: Residency
    ranking: Ranking | None  # what ranks its blocks when it is cut or recalls (None: nothing can)
    last_used: int
    state: SessionState = SessionState.LIVE
    parked: SessionRecord | None = None  # SUSPENDED: the record a resume brings back
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    cold: list[ColdRef] = field(default_factory=list)  # spilled by eviction
    last_logits: npt.NDArray[np.float32] | None = None
    resident: int = 0  # resident tokens, kept in step with the executor (cheap budget checks)
    peak: int = 0  # the most this session held after any step
    committed: SessionRecord | None = None  # as of its last commit (what a failed call rolls back to)
    exact: bool = True  # recomputing its resident ranges from the log gives the KV they hold
    compressing: bool = False  # this turn recalled cold blocks: compress after the append
    retrieved: list[Range] = field(default_factory=list)  # recalled this turn and kept: kept first
    recall_ready: RecallReady | None = None  # its cold blocks, read while the backend was idle
    layouts: dict[int, tuple[Range, ...]] = field(default_factory=dict)  # log length -> resident, at commits
    mid_turn_until: float = 0.0  # monotonic time until which its reply is expected (its append just ended)
    touched_at: float = field(default_factory=time.monotonic)  # its last call came or ended (retention's clock)
    prefix_break: dict[str, Any] | None = None  # where its last chat render left its log (the next reply says)
    tool_paused_at: float | None = None  # monotonic time its turn ended in tool calls (None: its next call came)
    ephemeral: bool = False  # opened for one call and closed by it: never in the journal

    def remember_layout(self, log_length: int, resident: Sequence[Range]) -> None:
        """What was resident when the log was ``log_length`` long (a rollback there restores it)."""
        self.layouts[log_length] = tuple(resident)
        while len(self.layouts) > LAYOUTS_KEPT:
            del self.layouts[next(iter(self.layouts))]

    def paused_for_tools(self, now: float) -> bool:
        """Its turn ended in tool calls and the results are still on their way, within its
        policy's ``tool_pause_s``."""
        return tool_pause_holds(self.tool_paused_at, now, self.policy.tool_pause_s)

    @property
    def live(self) -> bool:
        return self.state is SessionState.LIVE

    @property
    def cold_bytes(self) -> int:
        """Bytes it keeps in the cold store: its spilled blocks and, suspended, its parked state."""
        parked = 0 if self.live or self.parked is None else sum(ref.nbytes for ref in self.parked.blocks)
        return parked + sum(ref.nbytes for ref in self.cold)

    @property
    def scored_now(self) -> bool:
        """Cut to its budget by scores after each chunk (a scored policy, or a recall turn)."""
        return self.residency.compresses or self.compressing

    @property
    def record(self) -> SessionRecord:
        """The parked record of a suspended session."""
        if self.parked is None:
            raise AssertionError("a live session has no parked record")
        return self.parked

    def park(self, record: SessionRecord, state: SessionState = SessionState.SUSPENDED) -> None:
        self.state, self.parked = state, record
        self.resident, self.recall_ready = 0, None

    def forget_turn(self) -> None:
        """Back to an earlier state: what this turn scored and recalled no longer holds."""
        if self.ranking is not None:
            self.ranking.reset()
        self.compressing, self.retrieved = False, []
