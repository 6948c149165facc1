"""The one table of retention scenarios, written once, run against every executor.

Each scenario: a prompt of ``prompt_len`` tokens cut into ``block_size`` blocks (block i used at
time i), a budget, a streaming policy, optional per-block scores, capabilities to withhold, and the
resident ranges that must remain afterwards (worked out by hand, not by calling the planner).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvres.policy import Range, StreamPolicy

PROMPT_LEN = 200
BLOCK = 16


def prompt_tokens(n: int = PROMPT_LEN, seed: int = 0) -> list[int]:
    """Deterministic ids in [3, 60): valid for every executor's vocabulary."""
    return [3 + (i * 7 + seed * 13 + (i * i) % 11) % 57 for i in range(n)]


def _scores_high_on(*hot: int) -> list[float]:
    n_blocks = -(-PROMPT_LEN // BLOCK)
    return [1.0 if i in hot else 0.1 for i in range(n_blocks)]


@dataclass(frozen=True)
class Scenario:
    name: str
    budget: int
    expect_resident: list[Range]
    stream: StreamPolicy = field(default_factory=StreamPolicy)
    scores: list[float] | None = None
    withhold: tuple[str, ...] = ()
    pinned_blocks: tuple[int, ...] = ()
    expect_over_budget: bool = False
    expect_diagnostic: str | None = None


SCENARIOS = [
    Scenario(
        "streaming-budget-64", 64, [Range(0, 16), Range(160, 200)],
        stream=StreamPolicy(True, sink_tokens=4, recent_tokens=32),
    ),
    Scenario(
        "streaming-budget-128", 128, [Range(0, 16), Range(96, 200)],
        stream=StreamPolicy(True, sink_tokens=4, recent_tokens=32),
    ),
    Scenario(
        "streaming-no-pressure", 256, [Range(0, 200)],
        stream=StreamPolicy(True, sink_tokens=4, recent_tokens=32),
    ),
    Scenario("recency-budget-100", 100, [Range(112, 200)]),
    Scenario(
        "recency-pinned-block", 100, [Range(48, 64), Range(128, 200)], pinned_blocks=(3,),
    ),
    Scenario(
        "scored-budget-100", 100, [Range(32, 48), Range(80, 96), Range(144, 200)],
        scores=_scores_high_on(2, 5),
    ),
    Scenario(
        "scored-streaming-budget-100", 100,
        [Range(0, 16), Range(80, 96), Range(112, 128), Range(160, 200)],
        stream=StreamPolicy(True, sink_tokens=4, recent_tokens=32), scores=_scores_high_on(5, 7),
    ),
    Scenario(
        "degrade-without-remove-middle", 64, [Range(0, 200)],
        stream=StreamPolicy(True, sink_tokens=4, recent_tokens=32), withhold=("remove_middle",),
        expect_over_budget=True, expect_diagnostic="remove_middle",
    ),
    Scenario(
        "degrade-without-position-shift", 64, [Range(0, 200)],
        stream=StreamPolicy(True, sink_tokens=4, recent_tokens=32), withhold=("position_shift",),
        expect_over_budget=True, expect_diagnostic="position_shift",
    ),
    Scenario(
        "protected-over-budget", 32, [Range(0, 16), Range(128, 200)],
        stream=StreamPolicy(True, sink_tokens=4, recent_tokens=64),
        expect_over_budget=True, expect_diagnostic="protected",
    ),
]
