"""Calls commit all of their tokens or none: an append that fails after some of its chunks were
decoded leaves the session at its last commit, a full disk under the cold store loses no token,
and a call repeated with the same request id is answered, never applied twice."""

from __future__ import annotations

import errno
import uuid

import pytest
import ray

from kvres.actors.generation import GenerationRequest
from kvres.actors.host.backend import BackendFullError
from kvres.cluster import SessionPolicy
from kvres.policy import ContextLengthError

from .conftest import kill, logged, only_store, wait_restarted

PROMPT = [1, *range(100, 200)]
TURNS = ([1, *range(100, 260)], list(range(300, 500)), list(range(260, 300)))


def test_an_append_that_fails_past_the_budget_commits_nothing(faulty) -> None:
    """A session that kvres may not evict (kind "none") appends 1850 tokens onto 101 on a backend
    of 2000 where a pinned session keeps 900: within what the session may hold, so the call
    starts, but the second 512-token chunk does not fit beside the pinned one. The call raises
    the typed error, the token log is as it was, and the session continues as if the call had
    never been made; repeating the call with its request id fails the same way and commits
    nothing. Past what the session may hold at all (its context limit) the call is refused before
    any chunk goes in."""
    policy = SessionPolicy(kind="none")
    ref = faulty.open_session(backend="f0", policy=policy)
    ref.append(PROMPT)
    want = ref.generate(16)
    ref.close()

    pinned = faulty.open_session(backend="f0", policy=policy.with_retention(pin=True))
    pinned.append([100 + (3 * i) % 400 for i in range(900)])
    s = faulty.open_session(backend="f0", policy=policy)
    s.append(PROMPT)
    big = [100 + (7 * i) % 400 for i in range(1850)]
    with pytest.raises(BackendFullError, match="kv_budget_tokens=2000"):
        s.append(big)
    stats = s.stats()
    assert stats["token_count"] == len(PROMPT)
    assert stats["peak_resident_tokens"] >= len(PROMPT) + 512  # a chunk had landed before the failure
    assert stats["counters"]["rollbacks"] == 1
    handle = faulty.backend_handle("f0")
    request = uuid.uuid4().hex
    for _ in range(2):
        with pytest.raises(BackendFullError):
            ray.get(handle.append.remote(s.session_id, big, request))
    assert s.stats()["token_count"] == len(PROMPT)
    with pytest.raises(ContextLengthError, match="2051 is past the 2000 tokens"):
        s.append(big + big[:100])
    assert s.stats()["token_count"] == len(PROMPT)
    assert s.generate(16) == want  # the next call works, with the fault-free continuation
    pinned.close()
    s.close()


def test_a_call_repeated_with_its_request_id_is_applied_once(faulty) -> None:
    """What the driver's Session does after a backend death, done by hand: the same append and
    the same generate sent twice each (as a retry would) commit once and answer the same."""
    handle = faulty.backend_handle("f0")
    s = faulty.open_session(backend="f0")
    append_id, generate_id = uuid.uuid4().hex, uuid.uuid4().hex
    first = ray.get(handle.append.remote(s.session_id, PROMPT, append_id))
    again = ray.get(handle.append.remote(s.session_id, PROMPT, append_id))
    assert first == again == len(PROMPT) == s.stats()["token_count"]
    tokens = ray.get(handle.generate.remote(s.session_id, GenerationRequest(max_tokens=12, ignore_eos=True), generate_id))
    assert ray.get(handle.generate.remote(s.session_id, GenerationRequest(max_tokens=12, ignore_eos=True),
                                          generate_id)) == tokens
    assert s.stats()["token_count"] == len(PROMPT) + 12
    assert ray.get(handle.append.remote(s.session_id, [5, 6], uuid.uuid4().hex)) == len(PROMPT) + 14  # a new id appends
    s.close()


def test_a_text_append_repeated_with_its_request_id_answers_the_tokens_it_appended(faulty) -> None:
    """The first text of a session is tokenized with BOS; its retry (the session no longer empty)
    answers those same ids from the log instead of a new tokenization without BOS."""
    handle = faulty.backend_handle("f0")
    s = faulty.open_session(backend="f0")
    request = uuid.uuid4().hex
    first = ray.get(handle.append_text.remote(s.session_id, "Once upon a time", request))
    assert first[0] == ray.get(handle.tokenize.remote("x", True))[0]  # BOS: the session was empty
    assert ray.get(handle.append_text.remote(s.session_id, "Once upon a time", request)) == first
    assert s.stats()["token_count"] == len(first)
    more = ray.get(handle.append_text.remote(s.session_id, " there was", uuid.uuid4().hex))
    assert more and more[0] != first[0] and s.stats()["token_count"] == len(first) + len(more)
    s.close()


def _fill(disk) -> int:
    """Fill the tmpfs at ``disk`` with a ballast file until it is full; returns its size."""
    chunk = b"\0" * (64 << 10)
    written = 0
    with open(disk / "ballast", "wb", buffering=0) as f:
        while True:
            try:
                written += f.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return written


def _spilling_turns(s) -> list[object]:
    """Turns of a streaming session that spills its evicted blocks (to the disk tier here) and
    recalls them on its next append."""
    out: list[object] = [s.append(TURNS[0]), s.append(TURNS[1]), s.generate(16)]
    out += [s.append(TURNS[2]), s.generate(16)]
    return out


def test_a_full_disk_under_the_cold_store_loses_no_token(tight) -> None:
    """The tight cluster's disk tier (a tmpfs) filled for real: a streaming session's appends
    whose evictions spill to it commit every token and continue as with room on the disk (the
    blocks that could not be written stay in the backend's write-behind stage); a suspended
    session whose blocks the full disk refused, on a backend that died since, recomputes them
    from its log and continues identically."""
    streaming = SessionPolicy.streaming(96, recent_tokens=32)
    plain = SessionPolicy(kind="none")
    ref = tight.open_session(backend="t0", policy=streaming)
    want_turns = _spilling_turns(ref)
    assert ref.stats()["counters"]["spills"] > 0
    ref.close()
    ref = tight.open_session(backend="t0", policy=plain)
    ref.append(PROMPT)
    want_plain = ref.generate(8), ref.generate(24)
    ref.close()

    disk = tight.config.cold_store.disk_dir
    store = only_store(tight)
    ballast = _fill(disk)
    try:
        s = tight.open_session(backend="t0", policy=streaming)
        assert _spilling_turns(s) == want_turns
        assert s.stats()["token_count"] == sum(map(len, TURNS)) + 32
        assert ray.get(store.list_session.remote(s.session_id)) == []  # nothing could be written
        assert logged("DiskFullError", f"/blocks/{s.session_id}/", "No space left on device")
        s.close()

        p = tight.open_session(backend="t0", policy=plain)
        p.append(PROMPT)
        assert p.generate(8) == want_plain[0]
        resident = p.stats()["resident_tokens"]
        p.suspend()
        assert p.stats()["state"] == "suspended"  # answered after the store's (failed) write
        assert ray.get(store.list_session.remote(p.session_id)) == []
        backend = tight.backend_handle("t0")
        wait_restarted(backend, kill(backend))  # the write-behind copy dies with the backend
        assert p.resume() == resident
        assert p.generate(24) == want_plain[1]
        assert p.stats()["token_count"] == len(PROMPT) + 32
        p.close()
    finally:
        (disk / "ballast").unlink()
    assert ballast > 0
