"""The ``kvres`` command line.

Primitives:
- ``kvres demo [--model PATH] [--budget N] [--growth X]``: a local Ray cluster, the project's own
  model, a streaming session grown to several times its resident budget; prints each plan's effect,
  tier usage and throughput, with a progress bar.
- ``kvres status [--address ADDR] [--namespace NS]``: actors, sessions, budgets and tiers of a
  running cluster, as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .config import BackendConfig, ColdStoreConfig, KvresConfig, SessionPolicy


def _demo(args: argparse.Namespace) -> int:
    from kvres.actors.default_model import default_model_path

    model = Path(args.model) if args.model else default_model_path()
    print(f"kvres demo: model {model}")
    with tempfile.TemporaryDirectory(prefix="kvres-demo-") as disk:
        return _run_demo(args, model, Path(disk))


def _run_demo(args: argparse.Namespace, model: Path, disk: Path) -> int:
    from tqdm import tqdm

    from kvres.policy import CapabilityError

    from .session import connect

    config = KvresConfig(
        backends=[BackendConfig(name="demo", model_path=model, n_ctx=4096, n_seq_max=4,
                                kv_budget_tokens=args.budget * 2, n_threads=args.threads)],
        cold_store=ColdStoreConfig(ram_budget_bytes=4 * 1024 * 1024, disk_budget_bytes=256 * 1024 * 1024,
                                   disk_dir=disk),
    )
    manager = connect(namespace=f"kvres-demo-{int(time.time())}", config=config, include_dashboard=False)
    try:
        policy = SessionPolicy.streaming(args.budget, sink_tokens=4, recent_tokens=args.budget // 4)
        session = manager.open_session(policy=policy, session_id="demo-stream")
        try:
            prompt = session.append("once upon a time there was a little cat. ")
        except CapabilityError:  # a word-level vocabulary without byte fallback: feed token ids
            prompt = session.append(list(range(3, 43)))
        target = args.budget * args.growth
        print(f"session {session.session_id}: streaming policy, resident budget {args.budget} tokens, "
              f"growing to {target} tokens ({args.growth}x)")
        grown, t0, last = len(prompt), time.perf_counter(), session.stats()
        with tqdm(total=target, initial=grown, unit="tok", desc="generate") as bar:
            while grown < target:
                n = min(args.chunk, target - grown)
                session.generate(n)
                grown += n
                bar.update(n)
                stats = session.stats()
                c, p = stats["counters"], last["counters"]
                cold = ", ".join(f"{t} {v['blocks']} blocks/{v['bytes'] // 1024} KiB"
                                 for t, v in sorted(stats["cold"].items())) or "empty"
                bar.write(
                    f"  tokens {stats['token_count']:5d}  resident {stats['resident_tokens']:4d}/"
                    f"{args.budget}  evicted +{c['evictions'] - p['evictions']:2d} blocks "
                    f"(spilled +{c['spills'] - p['spills']:2d})  cold: {cold}"
                )
                last = stats
        seconds = time.perf_counter() - t0
        print(f"throughput: {(grown - len(prompt)) / seconds:.1f} tokens/s through the Ray API")
        session.suspend()
        print(f"suspended: {session.stats()['cold']}")
        recomputed = session.resume()
        print(f"resumed ({recomputed} tokens recomputed); resident {session.stats()['resident_tokens']}")
        print("next words:", repr(session.detokenize(session.generate(16))))
        print(json.dumps({k: v for k, v in manager.status().items() if k != "cold_stores"}, indent=2, default=str))
        session.close()
    finally:
        manager.shutdown()
    return 0


def _status(args: argparse.Namespace) -> int:
    import ray

    from kvres.actors.planner_actor import PLANNER_NAME

    ray.init(address=args.address or "auto", namespace=args.namespace, log_to_driver=False)
    try:
        planner = ray.get_actor(PLANNER_NAME, namespace=args.namespace)
    except ValueError:
        print(f"no kvres actors in namespace {args.namespace!r}", file=sys.stderr)
        return 1
    actors: dict[str, Any] = {}
    for info in ray.util.list_named_actors(all_namespaces=True):
        if info["namespace"] == args.namespace and info["name"].startswith("kvres-"):
            actors[info["name"]] = ray.get_actor(info["name"], namespace=args.namespace)
    report: dict[str, Any] = {"namespace": args.namespace, "sessions": ray.get(planner.directory.remote())}
    report["backends"] = [ray.get(h.stats.remote()) for n, h in actors.items() if n.startswith("kvres-backend-")]
    report["cold_stores"] = {n: ray.get(h.stats.remote()) for n, h in actors.items() if n.startswith("kvres-coldstore-")}
    print(json.dumps(report, indent=2, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvres", description="KV-cache residency manager on Ray")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the demo on a local Ray cluster")
    demo.add_argument("--model", help="a llama GGUF file (default: the project's own model)")
    demo.add_argument("--budget", type=int, default=256, help="resident token budget of the session")
    demo.add_argument("--growth", type=int, default=8, help="grow the session to this many budgets")
    demo.add_argument("--chunk", type=int, default=128, help="tokens generated per call")
    demo.add_argument("--threads", type=int, default=None, help="engine threads")
    status = sub.add_parser("status", help="show a running cluster's kvres actors")
    status.add_argument("--address", default=None, help="Ray address (default: auto)")
    status.add_argument("--namespace", default="kvres")
    args = parser.parse_args(argv)
    return _demo(args) if args.command == "demo" else _status(args)


if __name__ == "__main__":
    sys.exit(main())
