"""The HTTP front's handle of a bound session made from where its replica last ran it
(``kvres.cluster.serve.service.RememberedSession``): a turn on it asks the planner nothing; where
that backend no longer has the session it follows it where the directory says (moved by another
handle), and where the directory has it nowhere (closed meanwhile) it is opened again, once.
Through ``kvres.cluster`` sessions on a local Ray cluster (llama.cpp backends b0 and b1)."""

from __future__ import annotations

import uuid

import pytest

from kvres.cluster.serve.service import RememberedSession

PROMPT = list(range(3, 23))


def _counting_where(manager, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    asked: list[str] = []
    planner = manager.planner_client
    where = planner.where
    monkeypatch.setattr(planner, "where", lambda session_id: asked.append(session_id) or where(session_id))
    return asked


def _never() -> str:
    raise AssertionError("reopened a session that is open")


def test_a_remembered_session_asks_the_planner_nothing(manager, monkeypatch: pytest.MonkeyPatch) -> None:
    with manager.open_session(backend="b0", session_id=f"r-{uuid.uuid4().hex[:8]}") as s:
        s.append(PROMPT)
        asked = _counting_where(manager, monkeypatch)
        remembered = RememberedSession(manager, s.session_id, "b0", _never)
        got = list(remembered.stream(4, ignore_eos=True))
        assert asked == [] and len(got) == 4 and s.tokens() == PROMPT + got


def test_a_remembered_session_moved_meanwhile_is_followed(manager) -> None:
    with manager.open_session(backend="b0", session_id=f"r-{uuid.uuid4().hex[:8]}") as s:
        s.append(PROMPT)
        s.migrate("b1")
        remembered = RememberedSession(manager, s.session_id, "b0", _never)
        got = list(remembered.stream(4, ignore_eos=True))
        assert remembered.backend == "b1" and s.tokens() == PROMPT + got


def test_a_remembered_session_closed_meanwhile_is_opened_again_once(manager) -> None:
    sid = f"r-{uuid.uuid4().hex[:8]}"
    s = manager.open_session(backend="b0", session_id=sid)
    s.append(PROMPT)
    s.close()
    opened: list[str] = []

    def reopen() -> str:
        opened.append(sid)
        return manager.open_session(backend="b1", session_id=sid).backend

    remembered = RememberedSession(manager, sid, "b0", reopen)
    got = list(remembered.stream(4, ignore_eos=True, prompt=PROMPT))
    assert opened == [sid] and remembered.backend == "b1"
    assert manager.session(sid).tokens() == PROMPT + got  # the turn ran on the session opened again
    manager.session(sid).close()
    with pytest.raises(Exception, match=sid):  # gone again: reopened once only, then the error stands
        remembered.tokens()
