"""The executor contract: what a backend needs from an engine, as abstract base classes.

Primitives:
- ``EngineSessions``: what every engine offers: ``capabilities``, ``open_session``, ``append``,
  ``append_many`` (several sessions' tokens in one engine step; a loop over ``append`` unless the
  engine batches across sessions), ``append_many_first(first, rest, between)`` (one step whose
  ``first`` items' logits reach ``between`` as soon as the engine has them), ``token_log``,
  ``resident_ranges``, ``close_session``,
  ``tokenize(text, add_bos=True, special=False)`` (``special``: control-token text becomes their
  ids), ``detokenize(tokens, special=False)`` (``special``: control tokens render as their text;
  an id outside ``[0, n_vocab)`` raises ``TokenIdError``), ``n_vocab``, ``truncate(session_id,
  length)`` (the log becomes its first ``length`` tokens, as if the rest had never been appended;
  returns the next-token logits, or None); with defaults: ``end_of_generation()`` (the model's
  end-of-generation ids; none), ``chat_template()`` (a ``chat_source.ChatTemplateSource``; None),
  ``fork_session(source_id, new_id)`` (``CapabilityError``), ``sampler(params)`` (the numpy
  ``sampling.TokenSampler``; a grammar raises ``CapabilityError``), ``kv_profile`` (KV bytes per
  token, None where unknown),
  ``reserve_decode_threads`` / ``claim_decode_threads`` (which thread's decodes may use several
  threads; nothing by default), ``session_cells()`` (the most KV cells one session can hold where
  the engine bounds a session on its own; None); attributes ``engine`` (a name) and
  ``fingerprint`` (binds KV blocks to model, precision and geometry).
- ``Executor(EngineSessions)``: an engine whose KV kvres addresses range by range:
  ``evict_range``, ``admit_range``, ``export_range``, ``import_range``, ``fork_session`` (by
  default ``open_session`` with the source's log, then every resident range exported and imported),
  ``attention`` (a raw capture, where ``Capabilities.attention_capture`` says the engine has one)
  and ``keys`` (the resident keys, where ``Capabilities.key_access`` says so): the inputs of the
  scorer objects in ``kvres.policy.scorers``, the one scoring path. For recall, optionally:
  ``recall_attention`` (score cold blocks by a new turn's attention without importing them),
  ``prepare_recall`` (do the part of it that needs no turn ahead, while the backend is idle) and
  ``exchange`` (evict and import many ranges as one change).
- ``RECALL_PREP_BYTES``: what prepared recalls may hold, all sessions of an executor together.
- ``EngineManagedExecutor(EngineSessions)``: an engine that decides residency itself inside each
  request (openvino-genai): ``set_eviction`` and ``generate`` instead of range operations.
- ``apply_plan(executor, session_id, plan, spill=None)``: carry a ``Plan`` out on an executor.
- ``check_block_token_ids(session_id, log, blocks) -> log index``: every block carries the token
  ids the session's log holds over its range (``BlockMismatchError`` naming the first that does
  not); returns the log index of each carried token, blocks in the order given.

Positions. Every range here is in *token-log* positions: index i is the i-th token the session
ever received. The engine keeps its own cache position per resident token
(``kvres.policy.positions.PositionMap`` decides them): eviction with ``rebase=True`` closes the
gap (later tokens move down), ``rebase=False`` leaves it. Admitting or importing ``[a, b)`` places
it after the nearest resident token before it, keeping the original distance, and an imported
block goes back to its exported positions when they still lie after that token, so suspend +
resume restores the exact layout.

Truncation: every cell of a dropped token leaves the KV (resident ranges are cut at ``length``,
evicted ranges past it forgotten) and the positions become ``session_table.truncated_positions``'s,
so appending the same tokens again gives what a twin that never had the dropped ones gives.

Errors: an unknown session id raises ``UnknownSessionError``; a range outside the token log, or
not fully resident (evict, export) / not fully evicted (admit, import), raises ``RangeError``; a
block of another model, KV type or geometry raises ``BlockMismatchError``; an operation the
capabilities deny raises ``CapabilityError``; ``truncate`` to a length outside ``[0, len(log)]``
raises ``RangeError``; ``fork_session`` to an open id raises ``SessionExistsError``. None of them
changes the session.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from itertools import chain
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from kvres.actors.chat_source import ChatTemplateSource
from kvres.actors.sampling import Sampler, SamplingParams, TokenSampler
from kvres.coldstore.block import KVBlock
from kvres.policy.capabilities import Capabilities
from kvres.policy.capacity import LayerKVProfile
from kvres.policy.errors import BlockMismatchError, CapabilityError
from kvres.policy.planner import Plan, StreamPolicy
from kvres.policy.ranges import Range
from kvres.policy.scorers import KeyCapture
from kvres.policy.scoring import AttentionCapture

Logits = npt.NDArray[np.float32]

RECALL_PREP_BYTES = 64 << 20


class EngineSessions(ABC):
    engine: ClassVar[str]
    fingerprint: str

    @abstractmethod
    def capabilities(self) -> Capabilities: ...

    @abstractmethod
    def open_session(self, session_id: str, tokens: Sequence[int] = ()) -> None:
        """Open a session; ``tokens`` become its token log with no KV resident yet."""

    @abstractmethod
    def append(self, session_id: str, tokens: Sequence[int]) -> Logits:
        """Add tokens (batched prefill); return the next-token logits (empty where the engine
        computes them only inside ``generate``)."""

    def session_cells(self) -> int | None:
        """The most KV cells one session can hold in the engine, where the engine bounds a session
        on its own (llama.cpp's split layout: its stream; openvino-genai: its KV pool, which each
        request fills with the whole log); None: only the backend's budget does."""
        return None

    def append_many(self, items: Sequence[tuple[str, Sequence[int]]]) -> list[Logits]:
        """``append`` for several sessions (each at most once); an engine that can decode them in
        one batch overrides this. Items before a failing one stay appended."""
        return [self.append(session_id, tokens) for session_id, tokens in items]

    def append_many_first(self, first: Sequence[tuple[str, Sequence[int]]], rest: Sequence[tuple[str, Sequence[int]]],
                          between: Callable[[list[Logits]], None]) -> list[Logits]:
        """``append_many(first + rest)``, where ``between`` gets the ``first`` items' logits as soon
        as they are known: before ``rest`` is decoded where the engine decodes the two apart (this
        loop; llama.cpp's split layout, whose prompts and one-token decodes never share a pass),
        after it where one pass takes them all."""
        done = self.append_many(first)
        between(done)
        return done + self.append_many(rest)

    @abstractmethod
    def token_log(self, session_id: str) -> list[int]: ...

    @abstractmethod
    def resident_ranges(self, session_id: str) -> list[Range]: ...

    @abstractmethod
    def close_session(self, session_id: str) -> None: ...

    @abstractmethod
    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]: ...

    @abstractmethod
    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str: ...

    @property
    @abstractmethod
    def n_vocab(self) -> int: ...

    @abstractmethod
    def truncate(self, session_id: str, length: int) -> Logits | None:
        """Keep the first ``length`` tokens of the log (module doc, Truncation); the next-token
        logits after them, None when the log is empty or its last token is not resident."""

    def end_of_generation(self) -> frozenset[int]:
        """The token ids that end a generation (none by default)."""
        return frozenset()

    def chat_template(self) -> ChatTemplateSource | None:
        """The model's chat template and special tokens; None (this default) where it has none."""
        return None

    def fork_session(self, source_id: str, new_id: str) -> None:
        """A new session ``new_id`` holding the source's log, residency and KV; the two go on
        independently. This default refuses."""
        raise CapabilityError(f"the {self.engine} executor cannot fork sessions")

    def sampler(self, params: SamplingParams) -> Sampler:
        """A sampler for ``params``: this default is the numpy ``TokenSampler``, which has no grammar."""
        if params.needs_grammar:
            raise CapabilityError(f"the {self.engine} executor cannot sample with a grammar or JSON schema")
        return TokenSampler(params=params)

    def kv_profile(self) -> LayerKVProfile | None:
        """The KV bytes one token of a session takes in this engine's cache (layers, sliding windows,
        KV types): what a backend reports its resident and budget bytes by (docs/policies.md, T0).
        None (this default) where the engine does not say."""
        return None

    def reserve_decode_threads(self) -> None:
        """From now until some thread calls ``claim_decode_threads``, decode on one thread whatever
        thread calls (a backend calls it before its step loop starts, so no control call takes the
        engine's multi-threaded decodes first). This default does nothing: the engine needs no such
        rule."""
        return None

    def claim_decode_threads(self) -> None:
        """The calling thread (a backend's step loop, as it starts) becomes the one whose decodes use
        the engine's configured threads; decodes from other threads run on one thread. This default
        does nothing."""
        return None


class Executor(EngineSessions):
    @abstractmethod
    def evict_range(self, session_id: str, rng: Range, rebase: bool = False) -> None: ...

    def share_prefix(self, source_id: str, session_id: str, n: int) -> None:
        """The empty session ``session_id`` takes the source's first ``n`` tokens with their KV,
        without decoding them (the engine shares the cells where it can). This default refuses
        (``CapabilityError``): the caller prefills them instead."""
        raise CapabilityError(f"the {self.engine} executor cannot share a prefix between sessions")

    @abstractmethod
    def admit_range(self, session_id: str, rng: Range) -> None:
        """Recompute an evicted range from the token log and make it resident again."""

    @abstractmethod
    def export_range(self, session_id: str, rng: Range) -> KVBlock:
        """The KV of a resident range, as a block the cold store can keep."""

    @abstractmethod
    def import_range(self, session_id: str, block: KVBlock) -> None:
        """Make an exported block's range resident again, exactly as it was exported."""

    def fork_session(self, source_id: str, new_id: str) -> None:
        """``open_session(new_id, log)``, then every resident range of the source exported and
        imported (an import goes back to its exported positions, so the copy is exact, except that
        after a tail evicted without re-basing the fork appends right after its last resident token,
        where the source keeps the gap)."""
        log = self.token_log(source_id)
        blocks = [self.export_range(source_id, rng) for rng in self.resident_ranges(source_id)]
        self.open_session(new_id, log)  # SessionExistsError before anything changed
        try:
            for block in blocks:
                self.import_range(new_id, block)
        except BaseException:
            self.close_session(new_id)
            raise

    def attention(self, session_id: str, window: int | None = None) -> AttentionCapture:
        """Attention of the last ``window`` resident tokens over every resident token."""
        raise CapabilityError(f"the {self.engine} executor has no raw attention capture")

    def keys(self, session_id: str) -> KeyCapture:
        """Every resident key (after RoPE), labelled by token-log index."""
        raise CapabilityError(f"the {self.engine} executor cannot read its keys")

    def recall_attention(
        self, session_id: str, blocks: Sequence[KVBlock], tokens: Sequence[int], window: int, rebase: bool
    ) -> AttentionCapture:
        """Attention of the last ``window`` of ``tokens`` (a turn not appended yet) over the
        resident tokens, the ``blocks``' tokens as if imported (at ``kvres.policy.recall.
        exchange_layout``'s positions) and ``tokens`` themselves, all labelled by token-log index
        (``tokens`` continue the log): what a recall ranks cold blocks by. The session does not
        change, except that an engine may keep what it decoded and take it on the session's next
        ``append`` of exactly these tokens (if nothing but an ``exchange`` changed the session in
        between) instead of decoding them again. An engine without it raises ``CapabilityError``
        (a recall then imports first)."""
        raise CapabilityError(f"the {self.engine} executor cannot score blocks it has not imported")

    def prepare_recall(self, session_id: str, blocks: Sequence[KVBlock], rebase: bool) -> bool:
        """Get ready for ``recall_attention`` of ``blocks`` while the backend is idle: an engine may
        do now all the work that does not need the turn, and use it if the session is unchanged
        when the turn comes (kept within ``RECALL_PREP_BYTES`` over all sessions). True when it
        prepared something; this default prepares nothing."""
        return False

    def exchange(self, session_id: str, evict: Sequence[Range], blocks: Sequence[KVBlock], rebase: bool) -> list[KVBlock]:
        """Evict ``evict`` (resident ranges) and import ``blocks`` as one change; returns the evicted
        ranges exported, in ``evict``'s order. Engines that rewrite the session's KV in one step
        place everything at ``exchange_layout``'s positions; this default goes range by range."""
        exported = [self.export_range(session_id, rng) for rng in evict]
        for rng in sorted(evict, reverse=True):
            self.evict_range(session_id, rng, rebase=rebase)
        for block in sorted(blocks, key=lambda b: b.token_range.start):
            self.import_range(session_id, block)
        return exported


class EngineManagedExecutor(EngineSessions):
    @abstractmethod
    def set_eviction(
        self, session_id: str, stream_policy: StreamPolicy | None, budget_tokens: int = 0,
        aggregation: str = "NORM_SUM",
    ) -> None:
        """Let the engine keep sinks + recent window + its best blocks up to ``budget_tokens``;
        ``stream_policy=None`` turns the engine's eviction off for the session."""

    @abstractmethod
    def generate(
        self, session_id: str, max_tokens: int, temperature: float = 0.0, seed: int | None = None
    ) -> list[int]: ...


def check_block_token_ids(session_id: str, log: Sequence[int], blocks: Sequence[KVBlock]) -> npt.NDArray[np.int64]:
    starts = np.fromiter((b.token_range.start for b in blocks), dtype=np.int64, count=len(blocks))
    lens = np.fromiter((len(b.token_range) for b in blocks), dtype=np.int64, count=len(blocks))
    index = np.repeat(starts - np.cumsum(lens) + lens, lens) + np.arange(int(lens.sum()))
    carried = np.fromiter(chain.from_iterable(b.token_ids for b in blocks), dtype=np.int64, count=index.size)
    differs = np.nonzero(np.asarray(log, dtype=np.int64)[index] != carried)[0]
    if differs.size:
        b = blocks[int(np.searchsorted(np.cumsum(lens), differs[0], side="right"))]
        raise BlockMismatchError(f"block for {b.token_range} carries other token ids than session "
                                 f"{session_id!r} has there")
    return index


def apply_plan(
    executor: Executor,
    session_id: str,
    plan: Plan,
    spill: Callable[[KVBlock], None] | None = None,
) -> list[Range]:
    """Evict ``plan.evict_cold`` from the session, last range first so earlier positions stay put.

    With ``spill``, each range is exported and handed to it before it is evicted, so no KV is
    dropped before its copy is safe. Returns the evicted ranges in position order.
    """
    evicted = sorted(b.range for b in plan.evict_cold)
    for rng in reversed(evicted):
        if spill is not None:
            spill(executor.export_range(session_id, rng))
        executor.evict_range(session_id, rng, rebase=plan.rebase_positions)
    return evicted
