"""The store port over the cold-store actors: write-behind through a local stage, reads ahead.

Primitives:
- ``RayStorePort(name, namespace, stage_bytes=STAGE_BYTES)``: the port (``kvres.actors.host.store_ports.StorePort``)
  over ``ColdStoreActor``s looked up by name; every call, batched ones included, is one Ray call;
  writes are write-behind through a local stage (``stage_bytes``), so a resume right after a suspend
  reads nothing over Ray.
  ``defer_writes(True)`` (its backend is running calls) holds the write-behind sends back, for up to
  ``WRITE_DEFER_S`` and while the blocks held are at most the stage's size (beyond it the oldest
  go out), until ``defer_writes(False)`` (and ``SEND_AFTER_IDLE_S`` after it, or after they were
  queued where that is later): the calls do not share the CPU with them, and a session resumed
  before its write went out takes its blocks back without the store seeing them;
  ``send_now()`` sends what is queued at once; ``flush()`` returns once it is stored (a session
  handed to another backend, which reads its blocks from the store). ``prefetch(refs)``: start
  reading parked blocks a coming ``take`` will want (a call for a suspended session came in), in
  order with the writes before it and without waiting, so the resume finds them here instead of
  asking the store inside a step.
- ``stage_bytes_for(store_ram_budget_bytes) -> int``: a backend's stage beside its node's store (a
  quarter of the store's RAM budget, at least ``STAGE_BYTES``); ``home_stage_bytes(store, namespace)``
  asks the store for its budget (``STAGE_BYTES`` where it does not answer).

A store whose node died (``kvres.actors.ray_actors.nodes.store_node_dead``) is gone for good: a call
of another node's port raises ``ColdStoreGoneError``, which ``StorePort``'s batched calls by
``ColdRef`` answer as None.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Any

import ray

from kvres.actors.host.store_ports import ColdRef, StorePort
from kvres.coldstore import BlockKey, ColdStore, KVBlock, PutResult, Tier
from kvres.policy.errors import ColdStoreGoneError, ColdStoreLostError
from kvres.policy.recall import RecallCosts

from .nodes import store_node_dead

logger = logging.getLogger("kvres.coldstore")
STORE_RESTART_WAIT_S = 120.0  # how long a backend waits for a dead cold store to come back
STAGE_BYTES = 256 << 20  # the least write-behind stage of a backend's port (blocks of recent suspends)
# The stage is this share of its node's cold-store RAM budget where that is more (``stage_bytes_for``):
# a fleet whose parked sessions come back before they would go out (64 of ~14 MB over 4 slots) keeps
# them in the backend, where sending them, storing them and reading them back cost ~15 ms of CPU a
# turn in the store and the raylet beside a 2-core engine (docs/notes.md, 2026-12-07, late night).
STAGE_SHARE_OF_STORE_RAM = 4
STAGE_LOOKUP_S = 2.0  # how long a backend starting asks its home store for its RAM budget
# How long a write-behind send may wait for its backend to be between calls (while the blocks held
# fit the stage): a session parked for others' room while all slots are busy is often resumed within
# a few turns of the others, and then takes its blocks back and the store is sent nothing (a
# 700-token session of a 12-layer model is ~6 MB copied into Ray's object store and the store's RAM,
# then dropped: ~5% of a realistic fleet's turns on 2 cores). What this risks: a backend that dies
# recomputes from the token log the parked KV it had not sent (no token is lost).
WRITE_DEFER_S = 30.0
# once the backend is between calls (or a control call queued it: a suspend), how long a send waits
# for the answer of the call that made it to leave first and its driver's next call to come
SEND_AFTER_IDLE_S = 0.05
PREFETCH_WAIT_S = 10.0  # how long a take waits for a read ahead of it still under way, before asking itself
PREFETCH_BYTES = 256 << 20  # the most a port keeps read ahead for takes to come (the oldest dropped first)


def stage_bytes_for(store_ram_budget_bytes: int) -> int:
    """A home port's stage beside a store of ``store_ram_budget_bytes`` of RAM: a quarter of it, at
    least ``STAGE_BYTES``."""
    return max(STAGE_BYTES, store_ram_budget_bytes // STAGE_SHARE_OF_STORE_RAM)


def home_stage_bytes(store: str, namespace: str) -> int:
    """``stage_bytes_for`` the RAM budget of the cold store ``store`` (this node's), asked for at most
    ``STAGE_LOOKUP_S``; ``STAGE_BYTES`` where it does not answer (not started yet, restarting)."""
    try:
        handle: Any = ray.get_actor(store, namespace=namespace)
        stats: dict[str, int] = ray.get(handle.stats.remote(), timeout=STAGE_LOOKUP_S)
        return stage_bytes_for(int(stats["ram_budget_bytes"]))
    except Exception as exc:  # the stage is a cache: its least size serves until the next start
        logger.info("cold store %s did not say its RAM budget (%s): a stage of %d MiB",
                    store, type(exc).__name__, STAGE_BYTES >> 20)
        return STAGE_BYTES


class RayStorePort(StorePort):
    """The port over the cold-store actors. Writes to the home store are write-behind: a batch is
    kept in a local stage (``stage_bytes``, oldest out first) and handed to a sender thread
    that submits it (one Ray call, in order with this port's later calls, which wait until
    everything before them is submitted), so a suspend does not wait for the store and the resume
    that follows reads its blocks here and only tells the store to drop them. While the backend
    runs calls (``defer_writes``) the sender holds its batches until the backend is between calls,
    a later call of this port needs them out, the oldest has waited ``WRITE_DEFER_S``, or the
    blocks held outgrow the stage (then the oldest go out, as few as bring it back within): sending
    (serializing in this process, storing in the store's) would otherwise take CPU from the call
    that made them. The sender waits for the store to finish each batch (a failure is logged as
    it happens) and sends what queued meanwhile as one. Every other call waits for its answer."""

    def __init__(self, name: str, namespace: str, stage_bytes: int = STAGE_BYTES, foreign: bool = False) -> None:
        self.name = name
        self._foreign = foreign  # another node's store: its node's death is checked before each call
        self._namespace = namespace
        self._handle: Any = None
        self._stage: OrderedDict[BlockKey, KVBlock] = OrderedDict()
        self._stage_bytes = 0
        self._stage_limit = stage_bytes
        self._outbox: deque[tuple[str, tuple[Any, ...], float]] = deque()  # (method, args, when queued)
        self._sent = threading.Condition()
        self._sender: threading.Thread | None = None
        self._defer = False
        self._idle_since = 0.0
        self._flushing = 0  # calls waiting for the outbox to empty
        self._urgent = False  # send_now: what is queued goes out now
        self._sending = False  # a batch is out of the outbox, not yet submitted
        self._settling = False  # a submitted batch the store has not finished yet
        # prefetch: keys asked for and not here yet, and blocks read ahead for a coming take (they are
        # also still in the store); a take, delete or new write of a key cancels what is under way for it
        self._fetching: set[BlockKey] = set()
        self._fetched: OrderedDict[BlockKey, KVBlock] = OrderedDict()
        self._fetched_bytes = 0
        self._fetch_limit = PREFETCH_BYTES if stage_bytes > 0 else 0  # another node's port reads nothing ahead

    def at(self, store: str) -> ColdStore:
        return self if store == self.name else RayStorePort(store, self._namespace, stage_bytes=0, foreign=True)

    def _actor(self) -> Any:
        if self._handle is None:
            self._handle = ray.get_actor(self.name, namespace=self._namespace)
        return self._handle

    def _call(self, method: str, *args: Any) -> Any:
        with self._sent:
            self._flushing += 1
            self._sent.notify_all()
            try:
                while self._outbox or self._sending:  # calls keep the order they were made in
                    self._sent.wait()
            finally:
                self._flushing -= 1
        if self._foreign:
            self._check_node()
        try:
            return ray.get(getattr(self._actor(), method).remote(*args))
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnschedulableError, ValueError) as exc:
            first = f"{type(exc).__name__}"  # ValueError: no actor by that name (now)
        # the store died (Ray restarts it: its disk tier survives, RAM blocks are gone): wait for
        # it, looked up by name again, and repeat the call once; a store whose node died is gone
        self._handle = None
        deadline = time.monotonic() + STORE_RESTART_WAIT_S
        while True:
            self._check_node()
            try:
                return ray.get(getattr(self._actor(), method).remote(*args), timeout=10)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnschedulableError,
                    ray.exceptions.GetTimeoutError, ValueError) as exc:
                self._handle = None
                if time.monotonic() >= deadline:
                    raise ColdStoreLostError(
                        f"cold store {self.name!r} died ({first}) and did not answer again within "
                        f"{STORE_RESTART_WAIT_S:.0f} s ({type(exc).__name__}); the call {method!r} was not done"
                    ) from None
            time.sleep(0.2)

    def _check_node(self) -> None:
        if store_node_dead(self.name):
            raise ColdStoreGoneError(f"cold store {self.name!r} is gone with its node (dead): its blocks are "
                                     "lost and recomputed from the token log")

    def _send(self, method: str, *args: Any) -> None:
        """Submit without waiting (from the sender thread); a failure is logged when noticed."""
        self._actor()
        with self._sent:
            self._outbox.append((method, args, time.monotonic()))
            if self._sender is None or not self._sender.is_alive():
                self._sender = threading.Thread(target=self._send_loop, name=f"kvres-send-{self.name}", daemon=True)
                self._sender.start()
            self._sent.notify_all()

    def defer_writes(self, defer: bool) -> None:
        with self._sent:
            self._defer = defer
            if not defer:
                self._idle_since = time.monotonic()
            self._sent.notify_all()

    def send_now(self) -> None:
        with self._sent:
            if self._outbox:
                self._urgent = True
                self._sent.notify_all()

    def flush(self) -> None:
        with self._sent:
            self._flushing += 1  # what is held goes out now
            self._sent.notify_all()
            try:
                while self._outbox or self._sending or self._settling:
                    self._sent.wait()
            finally:
                self._flushing -= 1

    def _held_for(self) -> float | None:
        """How much longer the oldest batch waits (None: send it now)."""
        if self._held_bytes() > self._stage_limit:
            return None
        return self._time_left()

    def _time_left(self) -> float | None:
        """How much longer the oldest batch waits, whatever the bytes held (None: no longer)."""
        if self._flushing or self._urgent:
            return None
        now = time.monotonic()
        left = self._outbox[0][2] + WRITE_DEFER_S - now
        if not self._defer:
            left = min(left, max(self._idle_since, self._outbox[0][2]) + SEND_AFTER_IDLE_S - now)
        return left if left > 0 else None

    def _held_bytes(self) -> int:
        """The payload bytes of the writes queued here (the caller holds ``_sent``)."""
        return sum(block.payload_nbytes for method, args, _ in self._outbox if method == "put_many"
                   for block in args[0])

    def _send_loop(self) -> None:
        while True:
            with self._sent:
                while not self._outbox or (wait := self._held_for()) is not None:
                    self._sent.wait(wait if self._outbox else None)
                method, args = self._next_batch()
                self._sending = True
            try:
                ref = getattr(self._actor(), method).remote(*args)
            except Exception as exc:
                ref = None
                logger.warning("cold store %s: could not send %s: %s", self.name, method, exc)
            with self._sent:
                self._sending, self._settling = False, ref is not None
                if ref is None and method == "get_many":
                    self._fetching.difference_update(args[0])
                self._sent.notify_all()
            if ref is not None:
                try:
                    self._settle(ref, method, args)
                finally:
                    with self._sent:
                        self._settling = False
                        self._sent.notify_all()

    def _next_batch(self) -> tuple[str, tuple[Any, ...]]:
        """The oldest batch, with the batches of the same call queued right behind it merged in
        (a prefill that evicts chunk by chunk queues many): one Ray call for them all. Where only
        the bytes held made it due, the writes merged are just enough to bring them within the
        stage's size: the younger ones stay held for a resume that may take them back."""
        excess = self._held_bytes() - self._stage_limit if self._time_left() is not None else None
        method, args, _ = self._outbox.popleft()
        if method in ("put_many", "delete_many"):
            items = list(args[0])
            limit = excess if method == "put_many" else None  # the bytes to send, where only they made it due
            taken = sum(block.payload_nbytes for block in items) if limit is not None else 0
            while self._outbox and self._outbox[0][0] == method and self._outbox[0][1][1:] == args[1:]:
                if limit is not None and taken >= limit:
                    break
                more = self._outbox.popleft()[1][0]
                items.extend(more)
                taken += sum(block.payload_nbytes for block in more) if limit is not None else 0
            args = (items, *args[1:])
        if not self._outbox:
            self._urgent = False
        return method, args

    def _settle(self, ref: Any, method: str, args: tuple[Any, ...]) -> None:
        """Wait (without the GIL) until the store has done a write-behind call, so a failure is
        logged when it happens; what is queued meanwhile goes out as one batch after it. A read
        ahead (``prefetch``) keeps what it read for the take that comes."""
        try:
            answer = ray.get(ref)
        except Exception as exc:  # the staged copy, while it lasts, still serves a resume
            if method == "get_many":  # the take asks the store itself
                logger.debug("cold store %s: a read ahead failed: %s", self.name, exc)
                answer = [None] * len(args[0])
            else:
                logger.warning("cold store %s: a write-behind %s failed: %s", self.name, method, exc)
                return
        if method == "get_many":
            self._arrived(args[0], answer)

    def _arrived(self, keys: Sequence[BlockKey], blocks: Sequence[KVBlock | None]) -> None:
        with self._sent:
            for key, block in zip(keys, blocks, strict=True):
                if key not in self._fetching:
                    continue  # taken, deleted or written again meanwhile: this copy is stale
                self._fetching.discard(key)
                if block is not None:
                    self._fetched[key] = block
                    self._fetched_bytes += block.payload_nbytes
            while self._fetched_bytes > self._fetch_limit:  # a read ahead no take came for
                _, old = self._fetched.popitem(last=False)
                self._fetched_bytes -= old.payload_nbytes
            self._sent.notify_all()

    def prefetch(self, refs: Sequence[ColdRef]) -> None:
        if self._fetch_limit <= 0:
            return
        with self._sent:
            wanted = [r.key for r in refs if r.store == self.name and r.key not in self._fetching]
            for key in wanted:  # staged: kept for the take, whatever later suspends push out of the stage
                block = self._stage.get(key)
                if block is not None and key not in self._fetched:
                    self._fetched[key] = block
                    self._fetched_bytes += block.payload_nbytes
            keys = [k for k in wanted if k not in self._fetched]
            if not keys:
                return
            self._fetching.update(keys)
        self._send("get_many", keys)
        with self._sent:  # the writes queued before it go out now, then it
            self._urgent = True
            self._sent.notify_all()

    def _forget_fetched(self, keys: Sequence[BlockKey]) -> list[KVBlock | None]:
        """Cancel what a read ahead is doing for ``keys`` and hand over what it read (the caller
        holds ``_sent``)."""
        self._fetching.difference_update(keys)
        out = [self._fetched.pop(k, None) for k in keys]
        self._fetched_bytes -= sum(b.payload_nbytes for b in out if b is not None)
        return out

    def _unqueue_puts(self, keys: set[BlockKey]) -> list[BlockKey]:
        """Take ``keys`` out of the writes still queued here (a resume right after its suspend:
        the store never sees them); returns the keys that were already sent, to delete there."""
        if not keys:
            return []
        with self._sent:
            kept: deque[tuple[str, tuple[Any, ...], float]] = deque()
            for method, args, when in self._outbox:
                if method == "put_many":
                    queued = [(BlockKey.of(b), b) for b in args[0]]
                    blocks = [b for key, b in queued if key not in keys]
                    if len(blocks) < len(queued):
                        keys = keys - {key for key, _ in queued}
                        if not blocks:
                            continue
                        args = (blocks, *args[1:])
                kept.append((method, args, when))
            self._outbox = kept
            if not kept:
                self._urgent = False
        return list(keys)

    def _stage_blocks(self, blocks: Sequence[KVBlock]) -> None:
        for block in blocks:
            key = BlockKey.of(block)
            old = self._stage.pop(key, None)
            self._stage_bytes -= old.payload_nbytes if old is not None else 0
            if block.payload_nbytes <= self._stage_limit:
                self._stage[key] = block
                self._stage_bytes += block.payload_nbytes
        while self._stage_bytes > self._stage_limit:
            _, oldest = self._stage.popitem(last=False)
            self._stage_bytes -= oldest.payload_nbytes

    def _unstage(self, key: BlockKey) -> KVBlock | None:
        block = self._stage.pop(key, None)
        if block is not None:
            self._stage_bytes -= block.payload_nbytes
        return block

    def put(self, block: KVBlock, priority: int = 0) -> PutResult:
        return self.put_many([block], priority)[0]

    def put_many(self, blocks: Sequence[KVBlock], priority: int = 0) -> list[PutResult]:
        """Stage and send; the results are provisional (every block "ram", nothing displaced):
        the store's own log (``drain_dropped``) says what it later dropped."""
        if not blocks:
            return []
        with self._sent:
            self._forget_fetched([BlockKey.of(b) for b in blocks])
        self._stage_blocks(blocks)
        self._send("put_many", list(blocks), priority)
        return [PutResult(BlockKey.of(b), "ram") for b in blocks]

    def get(self, key: BlockKey) -> KVBlock | None:
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[BlockKey]) -> list[KVBlock | None]:
        out: list[KVBlock | None] = [self._stage.get(k) for k in keys]
        rest = [i for i, block in enumerate(out) if block is None]
        if rest:
            for i, block in zip(rest, self._call("get_many", [keys[i] for i in rest]), strict=True):
                out[i] = block
        return out

    def pop_many(
        self, keys: Sequence[BlockKey], nbytes: Sequence[int] | None = None, costs: RecallCosts | None = None
    ) -> list[KVBlock | None]:
        if not keys:
            return []
        with self._sent:  # a read ahead of this take still under way: wait for it (bounded)
            deadline = time.monotonic() + PREFETCH_WAIT_S
            while any(k in self._fetching for k in keys) and (left := deadline - time.monotonic()) > 0:
                self._sent.wait(left)
            fetched = self._forget_fetched(keys)
        out: list[KVBlock | None] = [self._unstage(k) for k in keys]
        for i, block in enumerate(fetched):
            if out[i] is None:
                out[i] = block
        # here (staged or read ahead): a write still queued is dropped, one already sent deleted there
        staged = self._unqueue_puts({keys[i] for i, block in enumerate(out) if block is not None})
        rest = [i for i, block in enumerate(out) if block is None]
        if staged:
            self._send("delete_many", staged)
        if rest:
            sizes = None if nbytes is None else [nbytes[i] for i in rest]
            for i, block in zip(rest, self._call("pop_many", [keys[i] for i in rest], sizes, costs), strict=True):
                out[i] = block
        return out

    def delete(self, key: BlockKey) -> bool:
        return self.delete_many([key]) == 1

    def delete_many(self, keys: Sequence[BlockKey]) -> int:
        with self._sent:
            self._forget_fetched(keys)
        for key in keys:
            self._unstage(key)
        return int(self._call("delete_many", list(keys))) if keys else 0

    def tier_of(self, key: BlockKey) -> Tier | None:
        tier: Tier | None = self._call("tier_of", key)
        return tier

    def tiers(self, keys: Sequence[BlockKey]) -> list[Tier | None]:
        return list(self._call("tiers", list(keys))) if keys else []

    def list_session(self, session_id: str) -> list[BlockKey]:
        return list(self._call("list_session", session_id))

    def drop_session(self, session_id: str) -> int:
        with self._sent:
            self._forget_fetched([k for k in {*self._fetching, *self._fetched} if k.session_id == session_id])
        for key in [k for k in self._stage if k.session_id == session_id]:
            self._unstage(key)
        return int(self._call("drop_session", session_id))
