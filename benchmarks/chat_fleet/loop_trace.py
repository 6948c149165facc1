"""The step loop of a served chat-fleet run, per turn, read from outside (what ``--sides kvres-host``
reports as ``step_loop`` for the host alone).

Primitives:
- ``timed_part(samples) -> (first, last)``: in a series of ``(t, loop)`` samples of a backend's
  ``stats()["loop"]``, the busy stretch after the first quiet one (the opening turns, the wait for
  quiet processes, then the timed turns).
- ``python -m benchmarks.chat_fleet.loop_trace --turns N [--address auto]``: run beside a chat-fleet
  run of one kvres side (``--sides kvres`` or ``kvres-local``, ``--repeats 1``; N its timed turns,
  conversations x turns); it waits for that run's Ray cluster and backend (``auto``: the one Ray
  cluster on this machine, found from its raylet; the machine's Ray token where it has one), samples the backend's step loop
  every 0.25 s until the backend is gone, and prints ``host_side.step_loop_per_turn`` of the timed
  part as JSON.

Why outside the run: ``kvres serve`` runs its own Ray cluster; reading the loop from the benchmark's
driver would make it a Ray driver of that cluster, with its CPU inside what the run counts.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

from .host_side import step_loop_per_turn

QUIET_S = 1.0  # no step for this long: the opening turns are over
SAMPLE_S = 0.25
START_WAIT_S = 300.0  # for the run's cluster and backend to come up (started beside it)

Sample = tuple[float, dict[str, float]]


def timed_part(samples: Sequence[Sample]) -> tuple[Sample, Sample]:
    """The first and last sample of the busy stretch that follows the first quiet one after the
    openings' steps (the wait before the first step, while the cluster and the run start, is not it)."""
    quiet_from: Sample | None = None
    start: Sample | None = None
    opened = False  # the openings have stepped
    for i in range(1, len(samples)):
        moved = samples[i][1]["steps"] != samples[i - 1][1]["steps"]
        if start is None:
            if moved:
                if opened and quiet_from is not None and samples[i - 1][0] - quiet_from[0] >= QUIET_S:
                    start = samples[i - 1]
                quiet_from, opened = None, True
            elif quiet_from is None:
                quiet_from = samples[i - 1]
    if start is None:
        raise ValueError("no quiet stretch followed by steps in the samples: was a run going on?")
    last = max((s for s in samples if s[0] >= start[0]), key=lambda s: s[1]["steps"])
    end = next(s for s in samples if s[1]["steps"] == last[1]["steps"])
    return start, end


def _backend(address: str, wait_s: float) -> Any:
    """The run's backend actor, waited for while the run starts its cluster and actors: ``auto`` is the
    one Ray cluster on this machine (found from its raylet, as ``kvres status`` finds it: a cluster
    ``kvres serve`` embeds is recorded nowhere else), joined with the machine's Ray token where there is one."""
    import ray

    from kvres.cluster.cluster_view import NoClusterError, local_cluster
    from kvres.cluster.ray_auth import follow_local_token

    deadline = time.monotonic() + wait_s
    while address == "auto":
        try:
            address, _ = local_cluster()
        except NoClusterError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)
    follow_local_token()
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    while True:
        named = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("kvres-backend-")]
        if named:
            return ray.get_actor(named[0]["name"], namespace=named[0]["namespace"])
        if time.monotonic() > deadline:
            raise SystemExit(f"no kvres backend in the Ray cluster at {address}")
        time.sleep(1.0)


def _samples(address: str, wait_s: float = START_WAIT_S) -> list[Sample]:
    import ray

    backend = _backend(address, wait_s)
    samples: list[Sample] = []
    while True:
        try:
            loop: Any = ray.get(backend.stats.remote(), timeout=30)["loop"]
        except Exception:  # the run ended: its cluster went with it
            return samples
        samples.append((time.monotonic(), loop))
        time.sleep(SAMPLE_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, required=True, help="the run's timed turns (conversations x turns)")
    parser.add_argument("--address", default="auto",
                        help="the run's Ray cluster (default: auto, the one on this machine)")
    args = parser.parse_args()
    (t0, first), (t1, last) = timed_part(_samples(args.address))
    print(json.dumps(step_loop_per_turn(first, last, t1 - t0, args.turns)), flush=True)


if __name__ == "__main__":
    main()
