"""``n`` choices of one chat turn as forks of one session: the prompt prefilled once, the replies
sampled side by side.

Primitives:
- ``choice_seed(seed, i) -> int | None``: choice ``i``'s seed: ``seed + i`` (in llama.cpp's 32-bit
  range) where the request gave one; else None (``Session.generate`` draws one per call).
- ``run_choices(service, session, prompt, plan, n, anchor, decode=None) -> list[TurnOutcome]``:
  the prompt appended to ``session`` (only what it lacks, prefilled once), then ``n - 1`` forks of
  it (``Session.fork``: the engine shares or copies the prompt's KV, nothing is decoded again);
  choice 0 is sampled on ``session`` itself (a bound session keeps it), choice ``i`` on fork ``i``
  with ``choice_seed(plan.seed, i)``, all at once (the backend batches them in its steps). The
  forks are closed before it returns, whatever happened.
- ``start_choice_streams(service, session, stack, prompt, plan, n, started, decode=None) ->
  ChoiceStreams``: the same, streamed: the prompt appended once, the forks made, and a started
  ``StreamingTurn`` on each (their first tokens pulled at once); ``stack`` (the request's: its
  lease, a one-request session) goes with choice 0, each fork's closes it. ``ChoiceStreams``:
  ``turns`` (choice ``i``'s), ``appended`` (what the prompt added), ``merged()`` (every choice's
  text pieces as they come, as ``(i, text)``; a piece counts as sent, for a client that leaves,
  once the response asked for the next), ``end_later()``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kvres.actors.sampling import SEED_LIMIT

from ..session_handle import Session
from .sampling_fields import GenerationPlan
from .turns import Decode, Prompt, StreamingTurn, TurnOutcome, append_prompt, reply_outcome

if TYPE_CHECKING:
    from .service import Service


def choice_seed(seed: int | None, i: int) -> int | None:
    return None if seed is None else (seed + i) % SEED_LIMIT


def run_choices(service: Service, session: Session, prompt: Prompt, plan: GenerationPlan, n: int,
                anchor: int | None, decode: Decode | None = None) -> list[TurnOutcome]:
    appended = append_prompt(session, prompt)
    with contextlib.ExitStack() as forks:
        sessions: list[Session] = [session]
        for _ in range(1, n):
            fork = session.fork()
            forks.callback(service.close_quietly, fork)
            sessions.append(fork)

        def reply(i: int) -> TurnOutcome:
            return reply_outcome(sessions[i], plan, appended, anchor, decode, choice_seed(plan.seed, i))

        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="kvres-choice") as pool:
            return list(pool.map(reply, range(n)))


@dataclass
class ChoiceStreams:
    turns: list[StreamingTurn]
    appended: int

    async def merged(self) -> AsyncIterator[tuple[int, str]]:
        queue: asyncio.Queue[tuple[int, str, asyncio.Event] | tuple[int, None, None]] = asyncio.Queue()

        async def pump(i: int, turn: StreamingTurn) -> None:
            try:
                async for piece in turn.deltas():
                    sent = asyncio.Event()
                    await queue.put((i, piece, sent))
                    await sent.wait()  # the piece went out: its turn may count it sent and pull on
            finally:
                await queue.put((i, None, None))

        pumps = [asyncio.create_task(pump(i, turn)) for i, turn in enumerate(self.turns)]
        try:
            ended = 0
            while ended < len(pumps):
                i, piece, sent = await queue.get()
                if piece is None or sent is None:
                    ended += 1
                    continue
                yield i, piece
                sent.set()
            for task in pumps:
                task.result()  # a choice that failed fails the response
        finally:
            for task in pumps:
                task.cancel()

    def end_later(self) -> None:
        for turn in self.turns:
            turn.end_later()


def start_choice_streams(service: Service, session: Session, stack: contextlib.ExitStack, prompt: Prompt,
                         plan: GenerationPlan, n: int, started: float, decode: Decode | None = None) -> ChoiceStreams:
    turns: list[StreamingTurn] = []
    stacks, sessions = [stack], [session]
    try:
        appended = append_prompt(session, prompt)
        for _ in range(1, n):
            fork = session.fork()
            fork_stack = contextlib.ExitStack()
            fork_stack.callback(service.close_quietly, fork)
            stacks.append(fork_stack)
            sessions.append(fork)
        # each holds the prompt: its turn appends nothing (no second render either: choice 0's reply
        # reports the prefix break the append found)
        nothing = Prompt(raw=[])
        turns = [StreamingTurn(service, sessions[i], stacks[i], nothing, replace(plan, seed=choice_seed(plan.seed, i)),
                               started, None, decode) for i in range(n)]
        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="kvres-choice") as pool:
            list(pool.map(StreamingTurn.start, turns))  # the first tokens of all, batched by the backend
        return ChoiceStreams(turns, appended)
    except BaseException:
        for turn in turns:
            with contextlib.suppress(Exception):
                turn.end()
        for each in stacks:  # (those of turns that ended are closed already)
            each.close()
        raise
