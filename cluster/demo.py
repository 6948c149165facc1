"""``kvres demo``: what kvres keeps, what it loses and what it costs, on a local Ray cluster.

Primitives:
- ``add_demo_arguments(parser)``, ``run_demo(args, out=sys.stdout) -> int``: the command.
- ``Workload``: prompts (token ids) and how an answer is judged. ``passkey_workload`` for the
  project's passkey model (is every digit of the hidden pass key retrieved?), ``text_workload`` for
  any other llama GGUF (how many continuation tokens equal the no-eviction run's?).
- ``demo_policies(budget)``: no eviction, streaming, SnapKV and H2O at one resident budget.
- ``compare_policies(manager, workload, policies, out)`` -> ``PolicyRow`` per policy: score,
  resident tokens at the answer, cold bytes per tier, seconds.
- ``move_session(manager, workload, out) -> bool``: one session suspended, resumed and migrated to
  the other backend while a twin runs uninterrupted; true when both continue identically.

The demo starts its own Ray cluster (two llama.cpp backends of the same model, one cold store with a
small RAM tier in front of a disk tier) and shuts it down at the end. Progress lines are drawn only
on a terminal; in a log each table appears once, whole.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

from kvres.policy import KvresError

from .kvres_config import BackendConfig, ColdStoreConfig, KvresConfig, SessionPolicy
from .status_view import format_table, human_bytes

BACKENDS = ("demo-0", "demo-1")
RAM_TIER_BYTES = 512 * 1024
DISK_TIER_BYTES = 256 * 1024 * 1024
SINK_TOKENS, RECENT_TOKENS, BLOCK_SIZE = 4, 16, 8  # recent covers the passkey question (10 tokens)
TEXT_CONTINUATION = 16
MOVE_STEP = 8
_SENTENCES = (
    "once upon a time there was a little cat who lived in a big house.",
    "the cat liked to play in the garden with a red ball.",
    "one day the sun was warm and the birds were singing in the tall tree.",
    "a little girl named lily came to visit the cat and they ran together.",
    "they found a small box under the tree and opened it slowly.",
    "inside the box was a shiny key, and the girl smiled.",
    "then the rain began to fall and they went back into the house.",
    "the dog was sleeping by the fire and the mother made some warm soup.",
)


@dataclass(frozen=True)
class Workload:
    kind: str  # "passkey" or "text"
    prompts: list[list[int]]
    answers: list[list[int]] | None  # the expected tokens (passkey), else judged against no eviction
    answer_tokens: int
    describe: str
    decode: Callable[[Sequence[int]], str]


@dataclass(frozen=True)
class PolicyRow:
    name: str
    score: str
    resident_tokens: float
    cold_bytes: dict[str, int]
    seconds: float
    outputs: list[list[int]]


def passkey_tasks_module(model: Path) -> ModuleType | None:
    """The passkey model's task generator, committed beside it (``models/passkey_tasks.py``)."""
    source = model.parent / "passkey_tasks.py"
    if not model.name.startswith("passkey") or not source.is_file():
        return None
    name = "kvres_demo_passkey_tasks"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def passkey_workload(pt: Any, count: int, n_tokens: int) -> Workload:
    tasks = pt.fixed_task_set(1, count, seed=0, n_tokens=n_tokens, depth=(1 / 3, 2 / 3))
    return Workload(
        "passkey", [list(t.prompt_ids) for t in tasks], [list(t.answer_ids) for t in tasks],
        len(tasks[0].answer_ids),
        f"{count} passkey prompts of {n_tokens} tokens, the pass key hidden in the middle third; "
        f"a prompt counts when every digit of the key comes back",
        lambda ids: str(pt.decode(ids)),
    )


def text_workload(manager: Any, count: int, n_tokens: int) -> Workload:
    backend = manager.backend(BACKENDS[0])
    prompts = []
    for i in range(count):
        rng = random.Random(f"kvres-demo/{i}")
        text = " ".join(rng.choice(_SENTENCES) for _ in range(max(8, n_tokens // 4)))
        try:
            ids = backend.tokenize(text, True)
        except KvresError:  # a vocabulary without byte fallback: token ids instead of text
            ids = [3 + (rng.randrange(40)) for _ in range(n_tokens)]
        while len(ids) < n_tokens:
            ids += ids[1:]
        prompts.append(ids[:n_tokens])
    return Workload(
        "text", prompts, None, TEXT_CONTINUATION,
        f"{count} prompts of {n_tokens} tokens; a policy scores the continuation tokens that equal "
        f"the no-eviction run's ({TEXT_CONTINUATION} per prompt, up to the first difference)",
        lambda ids: str(backend.detokenize(ids)),
    )


def demo_policies(budget: int) -> list[tuple[str, SessionPolicy]]:
    sink, recent, block = SINK_TOKENS, RECENT_TOKENS, BLOCK_SIZE
    return [
        ("no eviction", SessionPolicy()),
        ("streaming", SessionPolicy.streaming(budget, sink, recent, block)),
        ("SnapKV", SessionPolicy.scored(budget, "snapkv", sink, recent, block)),
        ("H2O", SessionPolicy.scored(budget, "h2o", sink, recent, block)),
    ]


def _same_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _score(workload: Workload, outputs: list[list[int]], reference: list[list[int]] | None) -> str:
    if workload.answers is not None:
        good = sum(o == a for o, a in zip(outputs, workload.answers, strict=True))
        return f"{good}/{len(outputs)} ({100 * good / len(outputs):.0f}%)"
    ref = reference or outputs
    same = sum(_same_prefix(o, r) for o, r in zip(outputs, ref, strict=True))
    total = sum(len(r) for r in ref)
    return f"{same}/{total} ({100 * same / max(total, 1):.0f}%)"


class _Progress:
    """A one-line progress indicator, drawn only when ``out`` is a terminal."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.live = bool(getattr(out, "isatty", lambda: False)())

    def show(self, text: str) -> None:
        if self.live:
            self.out.write("\r\033[K" + text)
            self.out.flush()

    def clear(self) -> None:
        self.show("")


def compare_policies(
    manager: Any, workload: Workload, policies: list[tuple[str, SessionPolicy]], out: TextIO
) -> list[PolicyRow]:
    """Every prompt under every policy, on one backend. A policy's sessions stay open until its row
    is measured, so its cold bytes are what all of them park at once (the RAM tier overflows to
    disk)."""
    progress = _Progress(out)
    warm = manager.open_session(backend=BACKENDS[0])  # the first call of a fresh engine is slower
    warm.append(workload.prompts[0])
    warm.generate(1)
    warm.close()
    rows: list[PolicyRow] = []
    reference: list[list[int]] | None = None
    for name, policy in policies:
        sessions, outputs, resident, seconds = [], [], [], 0.0
        for i, prompt in enumerate(workload.prompts):
            progress.show(f"  {name}: prompt {i + 1}/{len(workload.prompts)}")
            session = manager.open_session(policy=policy, backend=BACKENDS[0])
            sessions.append(session)
            t0 = time.perf_counter()
            session.append(prompt)
            outputs.append(session.generate(workload.answer_tokens))
            seconds += time.perf_counter() - t0
            resident.append(session.stats()["resident_tokens"])
        cold: dict[str, int] = {"ram": 0, "disk": 0}
        for session in sessions:
            for tier, v in session.stats()["cold"].items():
                cold[tier] = cold.get(tier, 0) + int(v["bytes"])
            session.close()
        reference = reference or outputs
        rows.append(PolicyRow(name, _score(workload, outputs, reference), sum(resident) / len(resident),
                              cold, seconds, outputs))
    progress.clear()
    return rows


def render_rows(rows: list[PolicyRow], workload: Workload) -> str:
    score = "accuracy" if workload.answers is not None else "same as no eviction"
    return format_table(
        ["policy", score, "resident tokens", "cold RAM", "cold disk", "time"],
        [[r.name, r.score, f"{r.resident_tokens:.0f}", human_bytes(r.cold_bytes.get("ram", 0)),
          human_bytes(r.cold_bytes.get("disk", 0)), f"{r.seconds:.1f} s"] for r in rows],
    )


def _cold_line(stats: dict[str, Any]) -> str:
    parts = [f"{tier} {v['blocks']} block(s), {human_bytes(v['bytes'])}" for tier, v in sorted(stats["cold"].items())]
    return "; ".join(parts) or "nothing"


def move_session(manager: Any, workload: Workload, out: TextIO) -> bool:
    """A session and its uninterrupted twin get the same prompt and the same calls; the session is
    suspended, resumed and migrated to the other backend on the way. True when their continuations
    are identical."""
    prompt = workload.prompts[0]
    twin = manager.open_session(backend=BACKENDS[0], session_id="demo-twin")
    moved = manager.open_session(backend=BACKENDS[0], session_id="demo-moved")
    try:
        for s in (twin, moved):
            s.append(prompt)
        print(f"Suspend, resume, migrate: session 'demo-moved' (no eviction, {len(prompt)}-token prompt "
              "of the first row), next to its uninterrupted twin 'demo-twin'", file=out)
        moved.suspend()
        stats = moved.stats()
        print(f"  suspend        KV of {stats['token_count']} tokens parked in the cold store: "
              f"{_cold_line(stats)}; resident on {moved.backend}: {stats['resident_tokens']}", file=out)
        recomputed = moved.resume()
        print(f"  resume         back on {moved.backend}: {moved.stats()['resident_tokens']} tokens "
              f"resident, {recomputed} recomputed", file=out)
        expected, got = twin.generate(MOVE_STEP), moved.generate(MOVE_STEP)
        before = moved.stats()["counters"].get("recomputed_tokens", 0)
        moved.migrate(BACKENDS[1])
        stats = moved.stats()
        print(f"  migrate        to {moved.backend}: {stats['resident_tokens']} tokens resident, "
              f"{stats['counters'].get('recomputed_tokens', 0) - before} recomputed", file=out)
        expected += twin.generate(MOVE_STEP)
        got += moved.generate(MOVE_STEP)
    finally:
        for s in (twin, moved):
            s.close()
    same = bool(expected == got)
    print(f"  continuation   {workload.decode(got)!r}", file=out)
    if workload.answers is not None:
        print(f"  pass key       {workload.decode(workload.answers[0])!r} "
              f"({'retrieved' if got[:workload.answer_tokens] == workload.answers[0] else 'missed'})", file=out)
    if same:
        print(f"continuation identical after suspend, resume and migrate: yes ({len(got)} tokens)", file=out)
    else:
        print(f"continuation identical after suspend, resume and migrate: NO (differs from token "
              f"{_same_prefix(expected, got)} of {len(got)})", file=out)
    return same


def _cluster_config(model: Path, args: argparse.Namespace, disk: Path) -> KvresConfig:
    n_ctx = 4096
    backends = [
        BackendConfig(name=name, model_path=model, n_ctx=n_ctx, n_seq_max=min(64, args.prompts + 2),
                      kv_budget_tokens=n_ctx, n_threads=args.threads)
        for name in BACKENDS
    ]
    return KvresConfig(backends=backends, cold_store=ColdStoreConfig(
        ram_budget_bytes=RAM_TIER_BYTES, disk_budget_bytes=DISK_TIER_BYTES, disk_dir=disk))


def run_demo(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    from kvres.actors.default_model import passkey_model_path

    from .session import connect

    model = Path(args.model) if args.model else passkey_model_path()
    policies = demo_policies(args.budget)  # bad budgets fail here, before Ray starts
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvres-demo-") as disk:
        config = _cluster_config(model, args, Path(disk))
        print(f"kvres demo: {model.name} on llama.cpp, through a local Ray cluster: backends "
              f"{' and '.join(BACKENDS)}, one cold store (RAM tier {human_bytes(RAM_TIER_BYTES)}, then disk)",
              file=out, flush=True)
        manager = connect(namespace=f"kvres-demo-{int(time.time())}", config=config, include_dashboard=False)
        try:
            pt = passkey_tasks_module(model)
            workload = (passkey_workload(pt, args.prompts, args.prompt_tokens) if pt is not None
                        else text_workload(manager, args.prompts, args.prompt_tokens))
            print(f"{workload.describe}.", file=out)
            print(f"Every evicting policy keeps at most {args.budget} tokens resident "
                  f"({100 * args.budget / args.prompt_tokens:.0f}% of the prompt): {SINK_TOKENS} sink tokens, "
                  f"the {RECENT_TOKENS} most recent, and blocks of {BLOCK_SIZE} chosen by the policy; "
                  "evicted blocks are spilled to the cold store.", file=out)
            print("", file=out, flush=True)
            rows = compare_policies(manager, workload, policies, out)
            print(render_rows(rows, workload), file=out)
            print("", file=out, flush=True)
            same = move_session(manager, workload, out)
        finally:
            manager.shutdown()
    print(f"demo took {time.perf_counter() - started:.0f} s", file=out)
    return 0 if same else 1


def _at_least(floor: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < floor:
            raise argparse.ArgumentTypeError(f"{value} is below the minimum of {floor}")
        return value
    return parse


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="a llama GGUF file (default: the project's passkey model)")
    parser.add_argument("--prompts", type=_at_least(1), default=8, help="prompts per policy (default 8)")
    parser.add_argument("--prompt-tokens", type=_at_least(64), default=300,
                        help="tokens per prompt (default 300)")
    parser.add_argument("--budget", type=int, default=96,
                        help="resident tokens every evicting policy keeps (default 96)")
    parser.add_argument("--threads", type=int, default=None, help="engine threads per backend")
