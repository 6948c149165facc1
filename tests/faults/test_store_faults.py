"""The cold store failing under suspended sessions: killed while they resume, or their block files
damaged on its disk tier. Every session resumes live, recomputes what it could not read, and
continues with the greedy tokens of a fault-free run.

What the cold store itself does with a damaged file (typed error, file deleted, a miss after) is
tested in tests/coldstore (test_disk_tier: truncated, checksum, another key; test_auth: forged
under the cluster's key) and tests/cluster/test_safety.py (a forged block refused by a cluster's
store); here it is the session on top that must not notice, beyond its counters."""

from __future__ import annotations

import os
import signal
import threading

import ray

from tests.coldstore.helpers import forge

from .conftest import kill, only_store, store_folder, wait_parked, wait_restarted

PROMPT = [1, *range(100, 250)]


def reference(manager, backend: str, prompt: list[int], n: int, then: int) -> tuple[list[int], list[int]]:
    s = manager.open_session(backend=backend)
    s.append(prompt)
    first, second = s.generate(n), s.generate(then)
    s.close()
    return first, second


def test_cold_store_killed_during_resume_of_four_sessions(faulty) -> None:
    """4 suspended sessions resumed from 4 threads as the store dies: all end live, none raises,
    each continues as a fault-free run (its blocks are read back, or recomputed when the store
    lost them with its RAM)."""
    want_first, want_second = reference(faulty, "f0", PROMPT, 8, 24)
    store = only_store(faulty)
    sessions = []
    for _ in range(4):
        s = faulty.open_session(backend="f0")
        s.append(PROMPT)
        assert s.generate(8) == want_first
        s.suspend()
        sessions.append(s)
    for s in sessions:
        wait_parked(store, s.session_id)
    # a restarted backend has no write-behind copy of the blocks: its resumes read the store
    backend = faulty.backend_handle("f0")
    wait_restarted(backend, kill(backend))

    old_store = int(ray.get(store.pid.remote()))
    go = threading.Barrier(5)
    recomputed: dict[str, int] = {}
    errors: list[BaseException] = []

    def resume(s) -> None:
        go.wait()
        try:
            recomputed[s.session_id] = s.resume()
        except BaseException as exc:  # pragma: no cover - shown by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=resume, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    go.wait()
    os.kill(old_store, signal.SIGKILL)  # as the four resumes go out
    for t in threads:
        t.join(timeout=300)
    assert errors == []
    # a resume that met the dead store waited for its restart and recomputed what its RAM lost
    assert set(recomputed.values()) <= {0, len(PROMPT) + 8} and any(recomputed.values()), recomputed
    for s in sessions:
        stats = s.stats()
        assert stats["state"] == "live" and stats["token_count"] == len(PROMPT) + 8
        assert s.generate(24) == want_second
    wait_restarted(store, old_store)
    for s in sessions:
        s.close()


def _damage(path, how: str, other=None) -> None:
    data = path.read_bytes()
    if how == "corrupt":
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0xFF  # a payload byte: its checksum no longer holds
        path.write_bytes(bytes(flipped))
    elif how == "truncated":
        os.truncate(path, len(data) // 2)
    elif how == "forged":
        path.write_bytes(forge(data, flip_payload_at=len(data) // 3))  # checksums right, tag not
    elif how == "swapped":
        path.write_bytes(other.read_bytes())
        other.write_bytes(data)


def test_damaged_block_files_of_suspended_sessions_are_recomputed(tight) -> None:
    """Corrupt, truncated, swapped (two sessions' files exchanged) and forged (checksums valid, tag
    made without the cluster's key) block files on the disk tier: each damaged session's resume
    recomputes its tokens instead of importing, the store counts the refusals, and every session
    continues exactly as a fault-free run; an untouched one imports its block."""
    cases = ["intact", "corrupt", "truncated", "forged", "swapped", "swapped"]
    prompts = {i: [1, *range(100 + 7 * i, 220 + 7 * i)] for i in range(len(cases))}
    want = {i: reference(tight, "t0", prompts[i], 8, 24) for i in prompts}
    store = only_store(tight)
    corrupt_before = ray.get(store.stats.remote())["corrupt"]
    sessions, resident = {}, {}
    for i in prompts:
        s = tight.open_session(backend="t0")
        s.append(prompts[i])
        assert s.generate(8) == want[i][0]
        resident[i] = s.stats()["resident_tokens"]
        s.suspend()
        sessions[i] = s
    files = {}
    for i, s in sessions.items():
        [key] = wait_parked(store, s.session_id)
        assert ray.get(store.tier_of.remote(key)) == "disk"
        [files[i]] = (store_folder(tight) / "blocks" / s.session_id).glob("*.kvb")
    for i, how in enumerate(cases):
        if how != "swapped":
            _damage(files[i], how)
    _damage(files[4], "swapped", files[5])
    # a restarted backend has no write-behind copy of the blocks: its resumes read the files
    backend = tight.backend_handle("t0")
    wait_restarted(backend, kill(backend))

    for i, s in sessions.items():
        recomputed = s.resume()
        counters = s.stats()["counters"]
        if cases[i] == "intact":
            assert recomputed == 0 and counters["admissions"] == 1
        else:
            assert recomputed == resident[i], cases[i]
            assert counters["admissions"] == 0 and counters["recomputed_tokens"] == resident[i], cases[i]
        assert counters["rebuilds"] == 1
        assert s.generate(24) == want[i][1], cases[i]
    assert ray.get(store.stats.remote())["corrupt"] - corrupt_before == len(cases) - 1
    for s in sessions.values():
        s.close()
    assert not any((store_folder(tight) / "blocks").rglob("*.kvb"))
