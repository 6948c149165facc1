"""How llama.cpp cuts a batch over several KV streams into micro-batches, and which idle streams
to add so that it cuts fewer.

Primitives:
- ``micro_batches(items, n_ubatch) -> int``: the micro-batches (passes over the weights)
  ``llama_decode`` runs for ``(seq, n_tokens)`` items in that batch order, in a context with a KV
  stream per sequence.
- ``gap_fillers(items, n_ubatch, can_fill) -> list[int]``: the idle sequences to give a
  throwaway token (decoded, then removed) so that the step runs in fewer passes.

Why: with one stream per sequence llama.cpp splits a batch "equally" and sequentially: a
micro-batch takes one run of consecutive sequence ids, the same number of tokens from each (the
fewest any of them has left). A step whose decodes are on sequences {0, 1, 2, 4, 5, 7} runs three
passes over the weights; with a token on 3 and on 6 it runs one (at 12 layers / hidden 768 on 2
cores: 23 ms against 30; a pass costs ~5.5 ms, a row ~2.2 ms, docs/notes.md, fleet).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

FILLER_ROW_COST = 0.4  # a throwaway row's cost, in passes over the weights (one-token rows, CPU)
MAX_GAP = 2  # wider gaps cost more in rows than the pass they save


def micro_batches(items: Sequence[tuple[int, int]], n_ubatch: int) -> int:
    """Passes ``llama_decode`` makes over ``items`` (``(seq, n_tokens)``, one sequence each, in
    batch order) when every sequence has a stream of its own (``split_equal``, sequential)."""
    left = [n for _, n in items]
    passes = 0
    while any(left):
        run: list[int] = []
        for i, (seq, _) in enumerate(items):
            if not left[i]:
                continue
            if not run or seq == items[run[-1]][0] + 1:
                run.append(i)
                if len(run) > n_ubatch:
                    break
        take = max(1, min(min(left[i] for i in run), n_ubatch // len(run)))
        for i in run:
            left[i] -= min(take, left[i])
        passes += 1
    return passes


def gap_fillers(items: Sequence[tuple[int, int]], n_ubatch: int, can_fill: Callable[[int], bool]) -> list[int]:
    """The idle sequences (``can_fill``: its stream has a free cell) whose one throwaway token each
    saves more than it costs, gap by gap between the items' sequences (sorted by sequence)."""
    ordered = sorted(items)
    seqs = [s for s, _ in ordered]
    cost = float(micro_batches(ordered, n_ubatch))
    chosen: list[int] = []
    for a, b in zip(seqs, seqs[1:], strict=False):
        gap = list(range(a + 1, b))
        if not gap or len(gap) > MAX_GAP or not all(can_fill(s) for s in gap):
            continue
        trial = sorted([*ordered, *((s, 1) for s in [*chosen, *gap])])
        trial_cost = micro_batches(trial, n_ubatch) + FILLER_ROW_COST * (len(chosen) + len(gap))
        if trial_cost < cost:
            chosen.extend(gap)
            cost = trial_cost
    return chosen
