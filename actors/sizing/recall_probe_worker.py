"""The child process a backend measures its recall costs in (``recall_costs.BackgroundRecallCosts``).

Run: ``python -m kvres.actors.sizing.recall_probe_worker MODEL [--threads N] [--gpu-layers N]
[--main-gpu I] [--disk-dir DIR | --no-disk] [--nice N] [--tier]``. Measures what is not cached
(``recall_costs.probed_recall_costs``, which caches it), prints the costs as one JSON line
(``recall_costs.recall_costs_to_json``; ``null`` without engine figures) and exits 0; with
``--tier`` it measures the model's figures T* reads instead (c_engage too, unless
``KVRES_C_ENGAGE_MS`` sets it) and prints them. A probe that fails exits 1 with its error on
stderr. It exits as soon as its parent is gone (on Linux the kernel kills it then, also while its
backend holds it stopped).

Primitives: ``main(argv=None) -> int``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
import time

PARENT_POLL_S = 0.5
PR_SET_PDEATHSIG = 1


def _exit_with_parent() -> None:
    # Linux: the kernel kills this process when the backend's thread that started it ends, even
    # while the backend holds it stopped (``BackgroundRecallCosts.pause``: no watch of its own runs)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)  # orphaned: the backend that wanted the figures is gone

    threading.Thread(target=watch, name="kvres-probe-parent-watch", daemon=True).start()


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
    parser.add_argument("--tier", action="store_true",
                        help="only the model's figures T* reads (c_engage too), printed as a JSON object")
    args = parser.parse_args(argv)
    if args.nice:
        os.nice(args.nice)

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
