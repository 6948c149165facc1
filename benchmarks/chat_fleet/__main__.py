"""The chat fleet against ``kvres serve`` and llama-server: the same conversations, interleaved.

Run: ``.venv/bin/python -m benchmarks.chat_fleet --config engine-free|realistic-16|realistic-64
[--conversations N] [--slots N] [--clients N] [--turns N] [--history-tokens N] [--user-tokens N]
[--reply-tokens N] [--repeats 3] [--threads 2] [--cache-ram-mib 4096] [--kv-layout split|unified]
[--sides kvres,llama-server] [--model PATH] [--out DIR]`` (also ``python -m benchmarks.serve --peer
llama-server ...`` and ``python -m benchmarks.fleet --http ...``). Needs ``make peers`` once.
Writes ``chat_fleet-<config>.json`` and ``.png`` into DIR (default benchmarks/results); each kvres
run prints (and keeps, as ``hops``) its per-hop profile (``benchmarks.chat_fleet.hops``).

Both servers run at once on the same GGUF (the shared stories260K model with a chat template
added, or ``benchmarks.realistic_model``'s shape with ``CHAT_TEMPLATE``): ``kvres serve`` (one
backend, ``--slots`` sequence slots, a KV budget of as many conversations, ``--threads``; its cold
store's RAM as large as llama-server's prompt cache) and llama-server (``-np`` slots, unified KV of
the same size, ``--cache-ram``, the same threads). ``--clients`` threads each take their
conversations' turns one after another (``benchmarks.chat_fleet.driver``); every conversation is
opened first with its history (untimed), then ``--turns`` timed turns of ``--user-tokens`` new
tokens and ``--reply-tokens`` generated (greedy, streamed). llama-server is sent the whole history
each turn (``cache_prompt``), kvres the same messages on a session bound by ``X-Session-Id``
(only what the session lacks is prefilled). Each repeat runs both sides on fresh conversations,
alternating which goes first. ``--sides`` may also name ``kvres-local`` and ``kvres-direct``: more
``kvres serve`` sides, each of its own embedded cluster, run with ``--front local`` / ``--front direct``
(``kvres`` runs the command's default front); the ratios then compare each kvres side with
llama-server and ``kvres-local`` with the other kvres sides. ``kvres-host`` runs the same turns on
kvres's backend host alone, no Ray and no HTTP, in a child process (``benchmarks.chat_fleet.host_side``):
the bound of what kvres's engine and step loop serve, beside what its front and Ray leave of it.

A driver stopped with SIGTERM (``kill``, a timeout) stops the servers it started before it exits
(``run`` calls ``stop_servers_on_sigterm``, so ``benchmarks.fleet --http`` gets it too): each
server runs in a session of its own, which a driver ending at once would leave running with its
Ray cluster.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.peers import LlamaServer, llama_server_path

from .driver import run_side
from .hops import hop_table
from .host_side import HOST_SIDE, HostSpec, run_host_side
from .report import compare, plot, pooled
from .sides import ChatModel, KvresServe, llama_server_flags, peer_side, prepare_model
from .workload import PRESETS, ChatWorkload, Conversation, build_conversations, words

ROOT = Path(__file__).resolve().parents[2]
SIDES = ("kvres", "llama-server")
KVRES_SIDES = {"kvres": None, "kvres-local": "local", "kvres-direct": "direct"}  # side -> kvres serve --front
ALL_SIDES = (*KVRES_SIDES, HOST_SIDE, "llama-server")
MiB = 1 << 20


@dataclass(frozen=True)
class Settings:
    config: str
    workload: ChatWorkload
    model_kind: str = "realistic"  # stories260K | realistic
    model: Path | None = None
    shape: Any = None  # a benchmarks.realistic_model.ModelShape for "realistic" (None: REALISTIC)
    threads: int = 2
    repeats: int = 3
    kv_layout: str = "split"
    cache_ram_mib: int = 4096
    sides: tuple[str, ...] = SIDES


def tokens_per_conversation(model: ChatModel, w: ChatWorkload, conversations: list[Conversation]) -> int:
    """What the longest conversation grows to, with room for replies that tokenize longer."""
    import numpy as np

    longest = 0
    filler = words(np.random.default_rng(0), w.reply_tokens, model.count)
    for c in conversations:
        whole = list(c.history)
        for user in c.user_turns:
            whole += [{"role": "assistant", "content": filler}, {"role": "user", "content": user}]
        longest = max(longest, model.count(model.render(whole)))
    return longest + (w.turns + 1) * w.reply_tokens + 64


def _print_run(repeat: int, run: dict[str, Any]) -> None:
    print(f"repeat {repeat + 1} {run['side']:>12}: {run['turns_per_s']:.2f} turns/s, TTFT p50 {run['ttft_p50_ms']:.0f} "
          f"ms p99 {run['ttft_p99_ms']:.0f} ms, turn p50 {run['latency_p50_ms']:.0f} ms p99 "
          f"{run['latency_p99_ms']:.0f} ms, {run['cpu_s_per_turn'] * 1e3:.1f} CPU ms/turn, "
          f"{run['prefilled_tokens']} tokens prefilled of {run['prompt_tokens']}, failed {run['failed_turns']}"
          + (f" ({run['failures'][0]})" if run["failures"] else ""), flush=True)


def run(s: Settings, out: Path, stem: str = "chat_fleet") -> dict[str, Any]:
    stop_servers_on_sigterm()
    w = s.workload
    binary = llama_server_path() if "llama-server" in s.sides else None  # says to `make peers` before anything
    with tempfile.TemporaryDirectory(prefix="kvres-chat-fleet-") as folder:
        tmp = Path(folder)
        path = prepare_model(s.model_kind, tmp, s.model, s.shape)
        model = ChatModel(path)
        repeats = [build_conversations(w, model.count, model.render, repeat) for repeat in range(s.repeats)]
        per_conversation = tokens_per_conversation(model, w, [c for cs in repeats for c in cs])
        flags = llama_server_flags(w, per_conversation, s.threads, s.cache_ram_mib)
        kvres_sides = [KvresServe(path, w, per_conversation, s.threads, s.kv_layout, s.cache_ram_mib * MiB, tmp,
                                  front=front, name=name) for name, front in KVRES_SIDES.items() if name in s.sides]
        peer = LlamaServer(path, flags, binary, tmp / "llama-server.log") if binary else None
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in s.sides}
        try:
            sides = {}
            for kvres in kvres_sides:
                sides[kvres.name] = kvres.start().side()
            if peer is not None:
                sides["llama-server"] = peer_side(peer.start())
            for repeat, conversations in enumerate(repeats):
                order = list(s.sides) if repeat % 2 == 0 else list(reversed(s.sides))
                for name in order:
                    if name == HOST_SIDE:
                        runs[name].append(run_host_side(HostSpec(
                            str(path), asdict(w), repeat, per_conversation, s.threads, s.kv_layout,
                            s.cache_ram_mib * MiB, str(tmp))))
                        _print_run(repeat, runs[name][-1])
                        continue
                    other = next((sides[o] for o in sides if o != name), None)
                    runs[name].append(run_side(sides[name], other, w, conversations))
                    _print_run(repeat, runs[name][-1])
                    if "hops" in runs[name][-1]:
                        print(hop_table(runs[name][-1]["hops"]), flush=True)
        finally:
            if peer is not None:
                peer.stop()
            for kvres in kvres_sides:
                kvres.stop()
    rows = {name: pooled(rs) for name, rs in runs.items()}
    result = {
        "config": s.config, "model": str(s.model) if s.model else s.model_kind,
        "shape": asdict(s.shape) if s.shape is not None else None, "workload": asdict(w),
        "threads": s.threads, "repeats": s.repeats, "tokens_per_conversation": per_conversation,
        "kvres": {"kv_layout": s.kv_layout, "slots": w.slots, "kv_budget_tokens": w.slots * per_conversation,
                  "cold_ram_mib": s.cache_ram_mib},
        "llama_server": {"binary": str(binary) if binary else None, "flags": flags},
        "sides": rows, "ratios": {**compare(runs, rows), **compare(runs, rows, "kvres-local"),
                                  **compare(runs, rows, "kvres-direct"), **compare(runs, rows, "kvres-local", "kvres"),
                                  **compare(runs, rows, "kvres-local", "kvres-direct"),
                                  **compare(runs, rows, HOST_SIDE), **compare(runs, rows, "kvres", HOST_SIDE),
                                  **compare(runs, rows, "kvres-local", HOST_SIDE)}, "runs": runs,
    }
    for name, row in rows.items():
        print(f"{name:>12} over {row['repeats']} repeats: {row['turns_per_s']:.2f} turns/s, TTFT p50 "
              f"{row['ttft_p50_ms']:.0f} ms p99 {row['ttft_p99_ms']:.0f} ms, turn p50 {row['latency_p50_ms']:.0f} ms "
              f"p99 {row['latency_p99_ms']:.0f} ms, {row['cpu_s_per_turn'] * 1e3:.1f} CPU ms/turn")
    if result["ratios"]:
        print(json.dumps(result["ratios"], indent=1))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}-{s.config}.json").write_text(json.dumps(result, indent=2))
    plot(result, out / f"{stem}-{s.config}.png")
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", choices=tuple(PRESETS), default="engine-free")
    for name in ("conversations", "slots", "clients", "turns", "history_tokens", "user_tokens", "reply_tokens"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help="(default: the --config's)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of both sides, alternating which goes first")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache-ram-mib", type=int, default=4096,
                        help="llama-server's --cache-ram, and kvres's cold-store RAM (MiB)")
    parser.add_argument("--kv-layout", choices=("split", "unified"), default="split",
                        help="the kvres backend's llama.cpp KV layout (llama-server runs unified KV)")
    parser.add_argument("--sides", default=",".join(SIDES), help="which servers (comma-separated)")
    parser.add_argument("--model", type=Path, default=None,
                        help="a GGUF instead of the --config's model (a chat template is added where it has none)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")


def settings_of(args: argparse.Namespace) -> Settings:
    preset = dict(PRESETS[args.config])
    sizes = {k: v for k, v in preset.items() if k != "model"}
    sizes.update({k: getattr(args, k) for k in sizes if getattr(args, k, None) is not None})
    sides = tuple(x for x in args.sides.split(",") if x)
    if not sides or set(sides) - set(ALL_SIDES):
        raise SystemExit(f"--sides: some of {', '.join(ALL_SIDES)}, got {args.sides!r}")
    if min(args.repeats, args.threads) < 1:
        raise SystemExit("--repeats and --threads must be >= 1")
    return Settings(config=args.config, workload=ChatWorkload(**sizes), model_kind=preset["model"], model=args.model,
                    threads=args.threads, repeats=args.repeats, kv_layout=args.kv_layout,
                    cache_ram_mib=args.cache_ram_mib, sides=sides)


def stop_servers_on_sigterm() -> None:
    """SIGTERM raises ``SystemExit`` (exit status 143), so ``run``'s ``finally`` stops the servers."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def main(argv: list[str] | None = None, stem: str = "chat_fleet") -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        settings = settings_of(args)
    except ValueError as exc:
        parser.error(str(exc))
    return run(settings, args.out, stem)


if __name__ == "__main__":
    main()

