"""The chat fleet's bound for kvres: the same turns on the backend host alone, no Ray, no HTTP.

Primitives:
- ``HOST_SIDE``: the side's name (``--sides kvres-host``).
- ``run_host_side(spec) -> dict``: one repeat in a child process (``python -m
  benchmarks.chat_fleet.host_side``, its engine threads and libgomp team its own), returning the
  driver's run dict (turns/s, TTFT and turn p50 / p99, CPU seconds per turn, prompt tokens, and
  ``step_loop``: ``step_loop_per_turn(before, after, wall_s, turns)``, the step loop's steps and
  time per turn).
  ``spec``: ``HostSpec(model, workload, repeat, tokens_per_conversation, threads, kv_layout,
  cold_ram_bytes, folder)``.

What it runs: a ``BackendHost`` built as ``kvres serve`` builds its backend for the chat fleet (one
engine, ``slots`` sequences, a KV budget of as many conversations, the layout and threads asked,
an in-process cold store with the same RAM), the repeat's conversations (``build_conversations``
with the same seed), each client a thread of the process taking its conversations' turns one after
another with ``chat_stream`` (what a front calls) and sending each reply back as its text decoded
in context (``Generation.text``, what the front sends). What it leaves out is everything between a
client and the host: HTTP, the front, Ray. Its CPU per turn is the whole process over the timed
part, the client threads included (they only read chunks); the HTTP sides' clients run in the
driver, outside what is counted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.fleet.workload import TurnTiming, summarize

from .driver import TEXT_ONLY, in_threads, wait_quiet
from .workload import ChatWorkload, Message

HOST_SIDE = "kvres-host"
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class HostSpec:
    model: str
    workload: dict[str, int]
    repeat: int
    tokens_per_conversation: int
    threads: int
    kv_layout: str
    cold_ram_bytes: int
    folder: str


def run_host_side(spec: HostSpec, timeout_s: float = 1800.0) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "benchmarks.chat_fleet.host_side"], input=json.dumps(asdict(spec)),
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout_s)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the host side exited with {done.returncode}: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def host_run(spec: HostSpec) -> dict[str, Any]:
    from kvres.actors.backend_setup.engine_registry import make_executor
    from kvres.actors.generation import GenerationRequest
    from kvres.actors.host.backend import BackendHost
    from kvres.actors.ray_actors.coldstore_actor import ColdStoreServer
    from kvres.actors.sampling import SamplingParams
    from kvres.testing import LocalStorePort

    from .sides import ChatModel, fleet_backend
    from .workload import build_conversations

    w = ChatWorkload(**spec.workload)
    chat_model = ChatModel(Path(spec.model))
    conversations = build_conversations(w, chat_model.count, chat_model.render, spec.repeat)
    config = fleet_backend(spec.model, w, spec.tokens_per_conversation, spec.threads, spec.kv_layout)
    folder = Path(tempfile.mkdtemp(prefix="host-side-", dir=spec.folder))
    store = ColdStoreServer(spec.cold_ram_bytes, folder / "cold", 4 * spec.cold_ram_bytes)
    host = BackendHost(config, make_executor(config, spec.model), store=LocalStorePort("n", {"n": store}))
    request = GenerationRequest(max_tokens=w.reply_tokens, ignore_eos=True,
                                sampling=SamplingParams(temperature=0.0, grammar=TEXT_ONLY))
    sessions = [f"host-{spec.repeat}-{i}" for i in range(w.conversations)]
    messages: list[list[Message]] = [list(c.history) for c in conversations]
    timings: list[TurnTiming] = []
    tokens = {"prompt": 0, "prefilled": 0, "completion": 0}
    failures: list[str] = []
    lock = threading.Lock()
    t0 = time.perf_counter()

    def take(i: int, k: int) -> None:
        start = time.perf_counter() - t0
        stream = host.chat_stream(sessions[i], messages[i], request)
        first = None
        while True:
            try:
                stream.next_chunk()
            except StopIteration:
                break
            first = first if first is not None else time.perf_counter() - t0
        end = time.perf_counter() - t0
        reply = stream.generation
        assert reply is not None and reply.text is not None
        messages[i].append({"role": "assistant", "content": reply.text})
        if k >= 0:
            with lock:
                timings.append(TurnTiming(i, k, start, first if first is not None else end, end))
                length = reply.length if reply.length is not None else len(host.tokens(sessions[i]))
                tokens["prompt"] += length - len(reply)
                tokens["prefilled"] += reply.prompt_tokens or 0
                tokens["completion"] += len(reply)

    def opening(c: int) -> None:
        for i in w.conversations_of(c):
            host.open_session(sessions[i])
            take(i, -1)

    def timed(c: int) -> None:
        for k in range(w.turns):
            for i in w.conversations_of(c):
                messages[i].append({"role": "user", "content": conversations[i].user_turns[k]})
                try:
                    take(i, k)
                except Exception as exc:  # counted, as the HTTP sides count theirs
                    with lock:
                        failures.append(f"conversation {i} turn {k}: {type(exc).__name__}: {exc}")
                    return

    try:
        opening_s = in_threads(w.clients, opening)
        waited, idle = wait_quiet([os.getpid()], window_s=1.0, timeout_s=60.0)
        cpu0, t0 = _cpu_s(), time.perf_counter()
        loop0 = host.stats()["loop"]
        wall = in_threads(w.clients, timed)
        cpu = _cpu_s() - cpu0
        loop1 = host.stats()["loop"]
    finally:
        host.shutdown()
    turns = max(1, len(timings))
    return {
        "side": HOST_SIDE, **summarize(timings, wall), "failed_turns": w.timed_turns - len(timings),
        "failures": failures[:5], "opening_s": opening_s, "waited_for_quiet_s": waited, "idle_cores_before": idle,
        "ttft_samples_s": [t.ttft_s for t in timings], "latency_samples_s": [t.latency_s for t in timings],
        "cpu_s": cpu, "cpu_s_per_turn": cpu / turns,
        "cpu_by_process": {"backend host and its client threads": {"cpu_s_per_turn": cpu / turns, "processes": 1}},
        "other_side_cpu_s": None, "prompt_tokens": tokens["prompt"], "cached_tokens": tokens["prompt"] - tokens["prefilled"],
        "prefilled_tokens": tokens["prefilled"], "completion_tokens": tokens["completion"], "retried_requests": 0,
        "step_loop": step_loop_per_turn(loop0, loop1, wall, turns),
    }


def step_loop_per_turn(before: dict[str, float], after: dict[str, float], wall_s: float, turns: int) -> dict[str, float]:
    """The backend's step loop over the timed part (``stats()["loop"]`` before and after), per turn:
    its steps, the engine's time in them, the rest of the steps' time (sampling, parking, the
    loop's Python and its waits for the GIL), and the share of the wall time the loop was stepping."""
    moved = {key: after[key] - before[key] for key in before}
    return {"steps": moved["steps"] / turns, "engine_tokens": moved["engine_tokens"] / turns,
            "engine_ms": 1000 * moved["engine_s"] / turns,
            "other_step_ms": 1000 * (moved["step_s"] - moved["engine_s"]) / turns,
            "busy_share": moved["step_s"] / wall_s if wall_s > 0 else 0.0}


if __name__ == "__main__":
    print(json.dumps(host_run(HostSpec(**json.loads(sys.stdin.read())))), flush=True)
