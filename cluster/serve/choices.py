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
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from kvres.actors.sampling import SEED_LIMIT

from ..session_handle import Session
from .sampling_fields import GenerationPlan
from .turns import Decode, Prompt, TurnOutcome, append_prompt, reply_outcome

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
