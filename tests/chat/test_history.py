"""Cancel, roll back, fork: a session's history changed exactly, on llama.cpp and OpenVINO.
Through kvres.cluster sessions on a local Ray cluster."""

from __future__ import annotations

import pytest

from kvres.cluster import SessionPolicy
from kvres.policy import ArgumentError, RangeError

PROMPT = list(range(3, 203))
ENGINES = ["b0", "ov"]


@pytest.mark.parametrize("backend", ENGINES)
def test_leaving_a_stream_after_3_of_200_commits_3(manager, backend) -> None:
    with manager.open_session(backend=backend) as s, manager.open_session(backend=backend) as twin:
        s.append(PROMPT[:20])
        twin.append(PROMPT[:20])
        stream = s.stream(200, ignore_eos=True)
        got = []
        for token in stream:
            got.append(token)
            if len(got) == 3:
                break
        del stream  # left: collected, like a loop variable going out of scope
        assert s.tokens() == PROMPT[:20] + got
        assert s.stats()["token_count"] == 23
        # what comes next is what a twin that was given those 3 tokens generates
        twin.append(got)
        assert s.generate(12, ignore_eos=True) == twin.generate(12, ignore_eos=True)


@pytest.mark.parametrize("backend", ENGINES)
def test_close_ends_the_stream_and_says_how(manager, backend) -> None:
    with manager.open_session(backend=backend) as s:
        s.append(PROMPT[:20])
        stream = s.stream(100, ignore_eos=True)
        first = [next(stream), next(stream)]
        stream.close()
        assert stream.finish_reason == "cancelled" and list(stream.generation or []) == first
        assert s.tokens() == PROMPT[:20] + first


@pytest.mark.parametrize("backend", ENGINES)
@pytest.mark.parametrize("policy", [SessionPolicy(), SessionPolicy.streaming(96, recent_tokens=32)],
                         ids=["none", "streaming"])
def test_rollback_then_generate_equals_a_twin_that_never_had_them(manager, backend, policy) -> None:
    with manager.open_session(backend=backend, policy=policy) as s, \
            manager.open_session(backend=backend, policy=policy) as twin:
        s.append(PROMPT[:60])
        twin.append(PROMPT[:60])
        first = s.generate(20, ignore_eos=True)
        twin.generate(20, ignore_eos=True)
        s.generate(25, ignore_eos=True)  # to be rolled back
        assert s.rollback(25) == 80
        assert s.tokens() == twin.tokens()
        assert s.generate(30, ignore_eos=True) == twin.generate(30, ignore_eos=True)
        assert len(first) == 20


@pytest.mark.parametrize("backend", ENGINES)
def test_truncate_a_suspended_session(manager, backend) -> None:
    with manager.open_session(backend=backend) as s, manager.open_session(backend=backend) as twin:
        s.append(PROMPT[:50])
        twin.append(PROMPT[:40])
        s.suspend()
        assert s.truncate(40) == 40
        assert s.tokens() == PROMPT[:40]
        assert s.generate(16, ignore_eos=True) == twin.generate(16, ignore_eos=True)


@pytest.mark.parametrize("backend", ENGINES)
def test_a_suspended_session_cut_by_its_last_tokens_comes_back_by_import(manager, backend) -> None:
    """A chat turn whose reply reads back as other tokens cuts a parked session by that reply: its
    parked block is imported whole and cut back, not the whole conversation recomputed; a cut past
    half the block recomputes what is kept."""
    with manager.open_session(backend=backend) as s, manager.open_session(backend=backend) as twin, \
            manager.open_session(backend=backend) as deep:
        s.append(PROMPT[:120])
        deep.append(PROMPT[:120])
        twin.append(PROMPT[:104])
        s.suspend()
        deep.suspend()
        before = s.stats()["counters"]
        assert s.truncate(104) == 104 and deep.truncate(40) == 40
        assert s.tokens() == PROMPT[:104] and deep.tokens() == PROMPT[:40]
        assert s.generate(16, ignore_eos=True) == twin.generate(16, ignore_eos=True)
        after = s.stats()["counters"]
        assert after["recomputed_tokens"] == before["recomputed_tokens"], after
        assert after["admissions"] > before["admissions"], after
        twin.truncate(40)
        assert deep.generate(8, ignore_eos=True) == twin.generate(8, ignore_eos=True)
        assert deep.stats()["counters"]["recomputed_tokens"] >= 40


def test_truncate_refuses_what_the_log_does_not_hold(manager) -> None:
    with manager.open_session(backend="b0") as s:
        s.append(PROMPT[:10])
        with pytest.raises(RangeError, match="11 tokens: its log holds 10"):
            s.truncate(11)
        with pytest.raises(RangeError, match="-1"):
            s.truncate(-1)
        with pytest.raises(ArgumentError, match="count"):
            s.rollback(True)
        assert s.tokens() == PROMPT[:10]


@pytest.mark.parametrize("backend", ENGINES)
def test_fork_continues_independently_and_the_parent_as_if_never_forked(manager, backend) -> None:
    with manager.open_session(backend=backend) as parent, manager.open_session(backend=backend) as twin:
        parent.append(PROMPT[:80])
        twin.append(PROMPT[:80])
        parent.generate(10, ignore_eos=True)
        twin.generate(10, ignore_eos=True)
        with parent.fork() as child_a, parent.fork("fork-b-" + backend) as child_b:
            assert child_a.tokens() == parent.tokens() == child_b.tokens()
            a = child_a.generate(24, temperature=1.0, seed=1, ignore_eos=True)
            b = child_b.generate(24, temperature=1.0, seed=2, ignore_eos=True)
            assert list(a) != list(b)  # different seeds, two continuations
            assert child_a.tokens()[-24:] == list(a) and child_b.tokens()[-24:] == list(b)
            assert parent.generate(24, ignore_eos=True) == twin.generate(24, ignore_eos=True)
            assert {child_a.session_id, child_b.session_id} <= {s.session_id for s in manager.sessions()}


def test_fork_of_a_spilling_session_copies_its_cold_blocks(manager) -> None:
    policy = SessionPolicy.streaming(96, recent_tokens=32)
    with manager.open_session(backend="b0", policy=policy) as parent:
        parent.append(PROMPT)
        spilled = sum(t["blocks"] for t in parent.stats()["cold"].values())
        assert spilled > 0
        with parent.fork() as child:
            assert sum(t["blocks"] for t in child.stats()["cold"].values()) == spilled
        assert sum(t["blocks"] for t in parent.stats()["cold"].values()) == spilled
