"""The child process a backend measures its recall costs in (``recall_costs.BackgroundRecallCosts``).

Run: ``python -m kvres.actors.sizing.recall_probe_worker MODEL [--threads N] [--gpu-layers N]
[--main-gpu I] [--disk-dir DIR | --no-disk] [--nice N] [--idle] [--tier]``. Measures what is not cached
(``recall_costs.probed_recall_costs``, which caches it), prints the costs as one JSON line
(``recall_costs.recall_costs_to_json``; ``null`` without engine figures) and exits 0; with
``--tier`` it measures the model's figures T* reads instead (c_engage too, unless
``KVRES_C_ENGAGE_MS`` sets it) and prints them. A probe that fails exits 1 with its error on
stderr. It exits as soon as its parent is gone. ``--idle``: it runs under Linux's ``SCHED_IDLE``
(where the OS has it), on CPU time nothing else wants.

Primitives: ``main(argv=None) -> int``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time

PARENT_POLL_S = 0.5


def _exit_with_parent() -> None:
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)  # orphaned: the backend that wanted the figures is gone

    threading.Thread(target=watch, name="kvres-probe-parent-watch", daemon=True).start()


def _idle_priority() -> None:
    """SCHED_IDLE for this process's threads (those made later inherit it). A niceness still
    takes a slice of a core now and then, and the backend's decode, several threads that meet at
    a barrier after every operation, then stalls as a whole while one of them waits for its core:
    the first turns on a fresh backend ran at up to twice the time of later ones beside nice-10
    probes."""
    policy = getattr(os, "SCHED_IDLE", None)
    if policy is None:
        return
    with contextlib.suppress(OSError):  # not allowed here: the niceness stays
        os.sched_setscheduler(0, policy, os.sched_param(0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--gpu-layers", type=int, default=0)
    parser.add_argument("--main-gpu", type=int, default=None)
    disk = parser.add_mutually_exclusive_group()
    disk.add_argument("--disk-dir", default=None)
    disk.add_argument("--no-disk", action="store_true")
    parser.add_argument("--nice", type=int, default=0)
    parser.add_argument("--idle", action="store_true", help="run under SCHED_IDLE where the OS has it")
    parser.add_argument("--tier", action="store_true",
                        help="only the model's figures T* reads (c_engage too), printed as a JSON object")
    args = parser.parse_args(argv)
    if args.nice:
        os.nice(args.nice)
    if args.idle:
        _idle_priority()

    from kvres.policy.errors import KvresError

    from .llama_probes import ProbeEngine
    from .recall_costs import probed_recall_costs, recall_costs_to_json

    try:
        engine = ProbeEngine(args.threads, args.gpu_layers, args.main_gpu)
        if args.tier:
            from .probe_cache import ENV_C_ENGAGE
            from .probes import load_model_figures
            from .tier_env import env_float

            c_engage = env_float(os.environ, ENV_C_ENGAGE, None) is None  # else the environment sets it
            figures, _ = load_model_figures(args.model, engine=engine, c_engage=c_engage)
            print(json.dumps(figures), flush=True)
            return 0
        costs = probed_recall_costs(args.model, disk_dir=args.disk_dir, disk_tier=not args.no_disk, engine=engine)
    except (KvresError, OSError) as exc:
        print(f"recall probe of {args.model!r} failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(recall_costs_to_json(costs)), flush=True)
    return 0


if __name__ == "__main__":
    _exit_with_parent()
    sys.exit(main())
