"""Calls that cannot get room wait for it instead of being refused, on the real llama.cpp engine:
a burst whose growth is more than the backend's budget completes (the last call in the queue gives
its room up mid-call and comes back, its output what it is alone), the first come first served
within a priority, and past ``max_room_wait_s`` (or past ``max_waiting_calls``) a call is refused
with a retry-after hint, committing nothing. (Through ``kvres serve``: tests/serve/test_room_wait.py.)"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.actors.generation import GenerationRequest
from kvres.actors.host.backend import BackendFullError, BackendHost
from kvres.actors.metrics import Metrics
from tests.conftest import local_host, shared_model_path, wait_until


class Recorded(Metrics):
    def __init__(self) -> None:
        self.depths: list[int] = []
        self.waits: list[tuple[float, str]] = []

    def set_room_queue_depth(self, backend: str, calls: int) -> None:
        self.depths.append(calls)

    def observe_room_wait(self, backend: str, seconds: float, outcome: str) -> None:
        self.waits.append((seconds, outcome))


PASSKEY = Path(__file__).resolve().parents[2] / "models" / "passkey.gguf"


def host(tmp_path: Path, budget: int, model: Path | None = None) -> BackendHost:
    cfg = BackendConfig(name="room", model_path=model or shared_model_path(), n_ctx=512, n_seq_max=8,
                        kv_budget_tokens=budget, n_threads=1)
    return local_host(cfg, tmp_path / "cold")


def prompt(seed: int, n: int, vocab: int = 400) -> list[int]:
    return [1] + [3 + (seed * 37 + k * 11 + (k * k) % 13) % (vocab - 13) for k in range(n - 1)]


def exactly(n: int) -> GenerationRequest:
    return GenerationRequest(max_tokens=n, ignore_eos=True)


def suspends(h: BackendHost, sid: str) -> int:
    return int(h.session_stats(sid)["counters"]["suspends"])



def read_all(streams: list[Any]) -> list[list[int]]:
    """Every stream read to its end at once, each by its own reader (a stream runs only a few
    tokens ahead of its reader, so streams read one after another could wait on each other)."""
    got: list[list[int]] = [[] for _ in streams]

    def read(i: int) -> None:
        got[i] = list(streams[i])

    readers = [threading.Thread(target=read, args=(i,)) for i in range(len(streams))]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(timeout=300)
    return got

def test_a_burst_past_the_budget_completes_the_last_call_giving_its_room_up(tmp_path: Path) -> None:
    """Four sessions that keep every token (kind "none") hold 32 tokens each of a 136-token budget
    and generate 16 more each at once: together they need 192. Each call holds what it has and
    needs more, so no call can free room by ending; the last in the queue is parked mid-call
    (preempted) while the others go on, and comes back when they are done. Every call completes
    with what its session generates alone; the first call is never parked. (The passkey model:
    its greedy choices have margins batching cannot flip, as in test_concurrency.)"""
    sids = [f"s{i}" for i in range(4)]
    ref = host(tmp_path / "ref", budget=136, model=PASSKEY)
    alone = {}
    for i, sid in enumerate(sids):  # each one's continuation, generated alone
        ref.open_session(sid, SessionPolicy())
        alone[sid] = list(ref.generate(sid, exactly(16), prompt=prompt(i, 32, vocab=133)))
        ref.close(sid)
    h = host(tmp_path, budget=136, model=PASSKEY)
    for i, sid in enumerate(sids):
        h.open_session(sid, SessionPolicy())
        h.append(sid, prompt(i, 32, vocab=133))
    with h._ctx.lock:  # the loop waits: the four calls arrive in this order before its next step
        streams = [h.stream(sid, exactly(16)) for sid in sids]
    got = read_all(streams)

    assert got == [alone[sid] for sid in sids]
    stats = h.stats()
    assert stats["peak_resident_tokens"] <= 136
    assert stats["room_queue"]["preempted"] >= 1 and stats["room_queue"]["refused"] == 0
    preempted = [h.session_stats(sid)["counters"]["preemptions"] for sid in sids]
    assert preempted[0] == 0 and preempted[-1] >= 1  # the last come gave its room up, never the first
    for i, sid in enumerate(sids):
        assert h.tokens(sid) == prompt(i, 32, vocab=133) + alone[sid]


def test_first_come_first_served_a_later_call_that_fits_waits_behind_an_earlier_one(tmp_path: Path) -> None:
    """On a 160-token budget, a turn of 100 tokens (a) runs; b (120) cannot fit beside it and waits;
    c (60) would fit beside a, but came after b: it waits behind b, then runs once b is done (b's
    session, idle by then, is the one parked for it). Were c let in ahead, b would wait on both, and
    c's session would be parked for b."""
    h = host(tmp_path, budget=160)
    for sid in "abc":
        h.open_session(sid, SessionPolicy())
    with h._ctx.lock:  # all three arrive, in this order, before the loop's next step
        a = h.stream("a", exactly(40), prompt=prompt(1, 60))
        b = h.stream("b", exactly(8), prompt=prompt(2, 112))
        c = h.stream("c", exactly(8), prompt=prompt(3, 52))
    for got in read_all([a, b, c]):
        assert len(got) in (40, 8)
    assert suspends(h, "a") == 1 and suspends(h, "b") == 1 and suspends(h, "c") == 0
    assert [len(h.tokens(sid)) for sid in "abc"] == [100, 120, 60]
    assert h.stats()["room_queue"]["waited"] >= 2  # b and c waited, and got room


def test_while_the_call_holding_room_waits_for_its_reader_no_empty_session_is_parked(tmp_path: Path) -> None:
    """The same three calls, a's reader late: a runs ahead of its reader and waits for it, b and c
    wait for room, so a step runs nothing. Parking c (which holds nothing) would free nothing and
    put it behind b twice; it is left be, and the order is a, b, c as when every reader keeps up."""
    h = host(tmp_path, budget=160)
    for sid in "abc":
        h.open_session(sid, SessionPolicy())
    with h._ctx.lock:
        a = h.stream("a", exactly(40), prompt=prompt(1, 60))
        b = h.stream("b", exactly(8), prompt=prompt(2, 112))
        c = h.stream("c", exactly(8), prompt=prompt(3, 52))
    assert wait_until(lambda: h.stats()["room_queue"]["waiting"] == 2)
    time.sleep(0.5)  # steps that run nothing: a waits for its reader, b and c for room
    assert suspends(h, "c") == 0
    for got in read_all([a, b, c]):
        assert len(got) in (40, 8)
    assert [suspends(h, sid) for sid in "abc"] == [1, 1, 0]


def test_a_higher_priority_call_gets_room_first(tmp_path: Path) -> None:
    """Two turns of 120 tokens on a 160-token budget arrive together, the second from a session of
    higher priority: it runs first; the first waits, then runs with the other's (idle) session
    parked for it."""
    h = host(tmp_path, budget=160)
    h.open_session("low", SessionPolicy())
    h.open_session("high", SessionPolicy().with_retention(priority=5))
    with h._ctx.lock:
        low = h.stream("low", exactly(8), prompt=prompt(4, 112))
        high = h.stream("high", exactly(8), prompt=prompt(5, 112))
    assert [len(got) for got in read_all([low, high])] == [8, 8]
    assert suspends(h, "high") == 1 and suspends(h, "low") == 0


def test_a_call_waits_until_room_frees(tmp_path: Path) -> None:
    """A pinned session holds most of the budget and no call runs: an append that does not fit
    waits (in the queue, in the stats) and goes in once the pinned session is closed."""
    h = host(tmp_path, budget=128)
    h.open_session("pinned", SessionPolicy().with_retention(pin=True))
    h.append("pinned", prompt(6, 60))  # within max_pinned_tokens (half the budget): its pin holds
    h.open_session("s", SessionPolicy())
    h.append("s", prompt(7, 10))
    done: list[int] = []
    t = threading.Thread(target=lambda: done.append(h.append("s", prompt(8, 61)[1:])))
    t.start()
    assert wait_until(lambda: h.stats()["room_queue"]["waiting"] == 1)
    assert not done
    h.close("pinned")
    t.join(timeout=60)
    assert done == [70]
    queue = h.stats()["room_queue"]
    assert queue["waiting"] == 0 and queue["waited"] == 1 and queue["refused"] == 0


def test_past_the_wait_or_the_queue_bound_a_call_is_refused_with_a_hint(tmp_path: Path) -> None:
    """With ``max_room_wait_s=0.3`` and ``max_waiting_calls=1``: of two calls that cannot get room,
    the second is refused at once (the queue is full), the first after waiting 0.3 s; both with a
    retry-after hint, both committing nothing. The metrics saw the queue's depth and the waits."""
    metrics = Recorded()
    cfg = BackendConfig(name="room", model_path=shared_model_path(), n_ctx=512, n_seq_max=8, kv_budget_tokens=128,
                        n_threads=1, max_room_wait_s=0.3, max_waiting_calls=1)
    h = local_host(cfg, tmp_path / "cold", metrics=metrics)
    h.open_session("pinned", SessionPolicy().with_retention(pin=True))
    h.append("pinned", prompt(6, 60))  # within max_pinned_tokens (half the budget): its pin holds
    for sid in ("first", "second"):
        h.open_session(sid, SessionPolicy())
        h.append(sid, prompt(7, 10))
    with h._ctx.lock:
        first = h.stream("first", exactly(4), prompt=prompt(8, 60))
        second = h.stream("second", exactly(4), prompt=prompt(9, 60))
    with pytest.raises(BackendFullError, match="max_waiting_calls=1") as at_once:
        list(second)
    with pytest.raises(BackendFullError, match=r"kv_budget_tokens=128.*max_room_wait_s=0.3") as waited:
        list(first)
    for refusal in (at_once.value, waited.value):
        assert refusal.retry_after_s is not None and refusal.retry_after_s >= 1
    assert len(h.tokens("first")) == len(h.tokens("second")) == 10  # nothing committed
    queue = h.stats()["room_queue"]
    assert queue["refused"] == 2 and queue["waiting"] == 0
    assert 1 in metrics.depths and metrics.depths[-1] == 0
    assert sorted(outcome for _, outcome in metrics.waits) == ["refused", "refused"]
    assert max(seconds for seconds, _ in metrics.waits) >= 0.3


def test_a_suspended_session_is_cut_back_without_room(tmp_path: Path) -> None:
    """A chat client that keeps only its last messages sends a history the session no longer
    starts with: the session is cut back to where they agree (``truncate``). A suspended session
    that keeps every token is cut in its parked record, so that needs no room, even where none can
    be made (a pinned session holds it); its next call resumes only what is left, and continues as
    a session that only ever held that would."""
    h = host(tmp_path, budget=128)
    h.open_session("s", SessionPolicy())
    h.append("s", prompt(7, 100))
    h.open_session("pinned", SessionPolicy().with_retention(pin=True))
    h.append("pinned", prompt(6, 60))  # s is parked for it
    assert h.truncate("s", 20) == 20  # (a resume would need 100 tokens beside the pinned 60)
    assert h.session_stats("s")["state"] == "suspended" and h.tokens("s") == prompt(7, 100)[:20]
    h.open_session("twin", SessionPolicy())
    h.append("twin", prompt(7, 100)[:20])
    want = list(h.generate("twin", exactly(8)))
    h.close("twin")
    assert list(h.generate("s", exactly(8))) == want


def test_a_stream_left_while_its_session_is_preempted_keeps_what_it_says(tmp_path: Path) -> None:
    """The consumer of a stream whose session is parked mid-call leaves it, keeping its first
    token: the session ends with what the answer says (that token, or none where no room could be
    made to bring the session back and cut it), and goes on from there."""
    sids = [f"s{i}" for i in range(4)]
    ref = host(tmp_path / "ref", budget=136, model=PASSKEY)
    ref.open_session("s3", SessionPolicy())
    alone = list(ref.generate("s3", exactly(64), prompt=prompt(3, 32, vocab=133)))
    h = host(tmp_path, budget=136, model=PASSKEY)
    for i, sid in enumerate(sids):
        h.open_session(sid, SessionPolicy())
        h.append(sid, prompt(i, 32, vocab=133))
    with h._ctx.lock:
        streams = [h.stream(sid, exactly(64)) for sid in sids]
    answer = None

    def left() -> bool:
        nonlocal answer
        with h._ctx.lock:  # (no step runs meanwhile: it stays parked while it is left)
            if h.session_stats("s3")["state"] == "preempted":
                answer = h.cancel("s3", None, keep=1)
        return answer is not None

    readers = [threading.Thread(target=list, args=(stream,)) for stream in streams[3:]]  # s3's, left below
    for reader in readers:
        reader.start()
    got = [[] for _ in streams[:3]]

    def read(i: int) -> None:
        got[i] = list(streams[i])

    others = [threading.Thread(target=read, args=(i,)) for i in range(3)]
    for reader in others:
        reader.start()
    assert wait_until(left, every_s=0.001)
    for reader in others + readers:
        reader.join(timeout=300)
    assert [len(g) for g in got] == [64, 64, 64]
    assert answer is not None and answer.finish_reason == "cancelled"
    assert list(answer) in ([], alone[:1])
    assert h.tokens("s3") == prompt(3, 32, vocab=133) + list(answer)
    assert len(h.generate("s3", exactly(4))) == 4
