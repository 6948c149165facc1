"""The HTTP clients of a chat-fleet run: one server side, every conversation, timed and counted.

Primitives:
- ``TEXT_ONLY``: the grammar every reply is sampled under (plain letters: a random-weight model's
  replies stay text that renders and tokenizes back the same on every server).
- ``chat_turn(client, side, messages, session, reply_tokens, t0) -> (reply text, TurnRecord)``: one
  streamed ``POST /v1/chat/completions`` (greedy, ``reply_tokens`` tokens, end of generation
  ignored, usage asked for); the first non-empty text delta is the time to first token. A request
  whose kept-alive connection the server had closed (no answer at all) is sent once more, on a
  fresh connection, and counted (``retries``); the turn's time starts with the first try.
- ``TurnRecord``: one turn as its client saw it (seconds since the clock started) and the prompt,
  cached and completion tokens the server counted.
- ``wait_quiet(roots) -> (seconds waited, cores)``: waits until the process trees of ``roots``
  together use less than ``QUIET_CORES`` of a core over a 2 s window (a backend's start-up probes,
  parking after the opening turns done), at most 300 s; ``cores``: what they used in the last window.
- ``in_threads(n, work) -> seconds``: ``work(c)`` for each client ``c`` of ``n``, each on its own
  thread, all at once; the wall time until the last ended.
- ``run_side(side, other, w, conversations, run_id) -> dict``: ``w.clients`` threads: first every
  conversation's opening turn (its history, untimed: a resumed chat), then, on the clock, each
  client's conversations' turns one after another; the CPU seconds of both sides' process trees
  over the timed part (/proc), the turns' timings and token counts. Bound sides (kvres) carry each
  conversation's ``X-Session-Id`` (the session is deleted afterwards, untimed); the others get the
  whole history each turn with ``cache_prompt``. A bound side's run carries ``hops``
  (``hops.hop_profile``: CPU per turn of each hop, and the front's time against the client's, from
  its ``/metrics`` read before and after the timed part).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.fleet.workload import TurnTiming, summarize

from .hops import hop_profile
from .proc_cpu import cpu_between, snapshot
from .sides import Side
from .workload import ChatWorkload, Conversation, Message

TEXT_ONLY = "root ::= [a-z ]+"
QUIET_CORES = 0.25  # an idle Ray cluster with Serve keeps about a tenth of a core busy


@dataclass(frozen=True)
class TurnRecord:
    conversation: int
    turn: int
    start_s: float
    first_token_s: float
    end_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    retries: int = 0  # the request sent again on a fresh connection (see ``chat_turn``)


def _stream(client: Any, body: dict[str, Any], headers: dict[str, str], t0: float) -> tuple[float | None, str,
                                                                                          dict[str, Any]]:
    import httpx

    for attempt in (0, 1):
        answered = False
        first, text = None, ""
        usage: dict[str, Any] = {}
        try:
            with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
                answered = True
                if r.status_code != 200:
                    raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:300]!r}")
                for line in r.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        raise RuntimeError(f"error event: {chunk['error']}")
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices", []):
                        piece = (choice.get("delta") or {}).get("content")
                        if piece:
                            first = first if first is not None else time.perf_counter() - t0
                            text += piece
            return first, text, {**usage, "retries": attempt}
        except (httpx.RemoteProtocolError, httpx.ConnectError):
            # a kept-alive connection the server closed while this client was slow to send its next
            # request (both servers close idle ones after 5 s): sent again once, as clients do
            if answered or attempt:
                raise
    raise AssertionError("unreachable")


def chat_turn(client: Any, side: Side, messages: list[Message], session: str | None, reply_tokens: int,
              t0: float, conversation: int = 0, turn: int = 0) -> tuple[str, TurnRecord]:
    body: dict[str, Any] = {"model": side.model_id, "messages": messages, "max_tokens": reply_tokens,
                            "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
                            "grammar": TEXT_ONLY, "ignore_eos": True}
    if not side.bound:
        body["cache_prompt"] = True
    headers = {"X-Session-Id": session} if session else {}
    start = time.perf_counter() - t0
    first, text, usage = _stream(client, body, headers, t0)
    end = time.perf_counter() - t0
    details = usage.get("prompt_tokens_details") or {}
    record = TurnRecord(conversation, turn, start, first if first is not None else end, end,
                        int(usage.get("prompt_tokens", 0)), int(details.get("cached_tokens", 0)),
                        int(usage.get("completion_tokens", 0)), int(usage["retries"]))
    if record.completion_tokens != reply_tokens:
        raise RuntimeError(f"{record.completion_tokens} reply tokens, not {reply_tokens}")
    return text, record


def _tree_seconds(root: int) -> float:
    return sum(e.total_s for e in snapshot(root).values())


def wait_quiet(roots: list[int], window_s: float = 2.0, timeout_s: float = 300.0) -> tuple[float, float]:
    t0 = time.perf_counter()
    cores = float("nan")
    while time.perf_counter() - t0 < timeout_s:
        before = sum(_tree_seconds(r) for r in roots)
        time.sleep(window_s)
        cores = (sum(_tree_seconds(r) for r in roots) - before) / window_s
        if cores < QUIET_CORES:
            break
    return time.perf_counter() - t0, cores


def _clients(side: Side, n: int) -> list[Any]:
    import httpx

    return [httpx.Client(base_url=side.base_url, timeout=600) for _ in range(n)]


def in_threads(n: int, work: Any) -> float:
    threads = [threading.Thread(target=work, args=(c,)) for c in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def run_side(side: Side, other: Side | None, w: ChatWorkload, conversations: list[Conversation],
             run_id: str | None = None) -> dict[str, Any]:
    run_id = run_id or uuid.uuid4().hex[:8]
    sessions = [f"peers-{run_id}-{i}" if side.bound else None for i in range(w.conversations)]
    messages = [list(c.history) for c in conversations]
    records: list[TurnRecord] = []
    failures: list[str] = []
    broken: set[int] = set()
    lock = threading.Lock()
    clients = _clients(side, w.clients)
    t0 = time.perf_counter()

    def take(c: int, i: int, k: int) -> None:
        if i in broken:
            return
        try:
            text, record = chat_turn(clients[c], side, messages[i], sessions[i], w.reply_tokens, t0, i, k)
        except Exception as exc:  # counted; the conversation stops, the run goes on
            with lock:
                failures.append(f"conversation {i} turn {k}: {type(exc).__name__}: {exc}")
                broken.add(i)
            return
        messages[i].append({"role": "assistant", "content": text})
        if k >= 0:
            with lock:
                records.append(record)

    def opening(c: int) -> None:
        for i in w.conversations_of(c):
            take(c, i, -1)

    def timed(c: int) -> None:
        for k in range(w.turns):
            for i in w.conversations_of(c):
                messages[i].append({"role": "user", "content": conversations[i].user_turns[k]})
                take(c, i, k)

    try:
        opening_s = in_threads(w.clients, opening)
        roots = [side.root_pid] + ([other.root_pid] if other else [])
        waited, idle_cores = wait_quiet(roots)
        metrics_before = _metrics_text(clients[0]) if side.bound else ""
        mine, theirs = snapshot(side.root_pid), snapshot(other.root_pid) if other else {}
        t0 = time.perf_counter()
        wall = in_threads(w.clients, timed)
        mine_after, theirs_after = snapshot(side.root_pid), snapshot(other.root_pid) if other else {}
        metrics_after = _metrics_text(clients[0]) if side.bound else ""
    finally:
        for i, session in enumerate(sessions):
            if session is not None:
                try:
                    clients[i % w.clients].delete(f"/v1/sessions/{session}")
                except Exception as exc:  # noted, the run's figures stand
                    failures.append(f"closing {session}: {type(exc).__name__}: {exc}")
        for client in clients:
            client.close()
    cpu = cpu_between(mine, mine_after)
    turns = max(1, len(records))
    timings = [TurnTiming(r.conversation, r.turn, r.start_s, r.first_token_s, r.end_s) for r in records]
    run = {
        "side": side.name, "run_id": run_id, **summarize(timings, wall), "failed_turns": w.timed_turns - len(records),
        "failures": failures[:5], "opening_s": opening_s, "waited_for_quiet_s": waited,
        "idle_cores_before": idle_cores,
        "ttft_samples_s": [t.ttft_s for t in timings], "latency_samples_s": [t.latency_s for t in timings],
        "cpu_s": sum(v.cpu_s for v in cpu.values()),
        "cpu_s_per_turn": sum(v.cpu_s for v in cpu.values()) / turns,
        "cpu_by_process": {name: {"cpu_s_per_turn": v.cpu_s / turns, "processes": v.processes}
                           for name, v in cpu.items()},
        "other_side_cpu_s": sum(v.cpu_s for v in cpu_between(theirs, theirs_after).values()) if other else None,
        "prompt_tokens": sum(r.prompt_tokens for r in records),
        "cached_tokens": sum(r.cached_tokens for r in records),
        "prefilled_tokens": sum(r.prompt_tokens - r.cached_tokens for r in records),
        "completion_tokens": sum(r.completion_tokens for r in records),
        "retried_requests": sum(r.retries for r in records),
        "prompt_tokens_by_turn": [sum(r.prompt_tokens for r in records if r.turn == k) / max(
            1, sum(1 for r in records if r.turn == k)) for k in range(w.turns)],
        "records": [asdict(r) for r in sorted(records, key=lambda r: (r.conversation, r.turn))],
    }
    if side.bound:
        run["hops"] = hop_profile(run, metrics_before, metrics_after)
    return run


def _metrics_text(client: Any) -> str:
    """The front's ``/metrics`` (kvres serve), read between the timed parts."""
    r = client.get("/metrics")
    return str(r.text) if r.status_code == 200 else ""
