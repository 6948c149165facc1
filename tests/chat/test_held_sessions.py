"""The HTTP front's handle of a bound session (``kvres.cluster.serve.holds.HeldSession``): its
turn is one call to the backend, which takes the request's hold on the session in that call and
releases it when the stream ends whole; another request is refused meanwhile; a hold fenced to
another tenant is refused as an unknown session. Made from where the front last ran the session, a
turn asks the planner nothing; where that backend no longer has the session it follows it where the
directory says (moved by another handle), and where the directory has it nowhere (closed
meanwhile) it is opened again, once. Through ``kvres.cluster`` sessions on a local Ray cluster
(llama.cpp backends b0 and b1)."""

from __future__ import annotations

import uuid

import pytest

from kvres.actors.host.refusals import OtherTenantsSessionError
from kvres.cluster.backend_client import BackendClient
from kvres.cluster.serve.holds import FrontHolds, HeldSession, retry_held
from kvres.cluster.serve.http_errors import ApiError, SessionLockedError

PROMPT = list(range(3, 23))


def _counting_where(manager, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    asked: list[str] = []
    planner = manager.planner_client
    where = planner.where
    monkeypatch.setattr(planner, "where", lambda session_id: asked.append(session_id) or where(session_id))
    return asked


def _never() -> str:
    raise AssertionError("reopened a session that is open")


def _held(manager, sid: str, backend: str = "b0", reopen=_never, fence=None) -> HeldSession:
    holds = FrontHolds(manager)
    return HeldSession(manager, sid, backend, reopen, holds.new(fence), holds)


def test_a_held_turn_is_one_call_that_takes_and_releases_the_hold(manager, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    for name in ("hold", "release_hold", "session_stats", "tokens"):
        original = getattr(BackendClient, name)
        monkeypatch.setattr(BackendClient, name, lambda self, *a, _n=name, _o=original, **k: calls.append(_n) or _o(self, *a, **k))
    with manager.open_session(backend="b0", session_id=f"h-{uuid.uuid4().hex[:8]}") as s:
        s.append(PROMPT)
        asked = _counting_where(manager, monkeypatch)
        first, second = _held(manager, s.session_id), _held(manager, s.session_id)
        stream = first.stream(4, ignore_eos=True)
        got = [next(stream)]
        assert calls == []  # the stream's own call took the hold: no call of its own, no planner call
        with pytest.raises(SessionLockedError, match=s.session_id):  # refused while the first request runs
            second.take()
        assert len(calls) > 1 and set(calls) == {"hold"}  # asked again for a moment, then refused
        got += list(stream)
        assert stream.released and asked == [] and len(got) == 4
        first.release()  # nothing left to release: the backend did when the stream ended whole
        assert set(calls) == {"hold"}
        refused = len(calls)
        assert second.take() is None  # free again (a session of no tenant)
        second.release()
        assert calls[refused:] == ["hold", "release_hold"] and s.tokens() == PROMPT + got


def test_a_stream_left_early_keeps_the_hold_until_its_request_releases_it(manager) -> None:
    with manager.open_session(backend="b0", session_id=f"h-{uuid.uuid4().hex[:8]}") as s:
        s.append(PROMPT)
        first, second = _held(manager, s.session_id), _held(manager, s.session_id)
        stream = first.stream(8, ignore_eos=True)
        next(stream)
        stream.close()  # the client left: its request still trims the session under the hold
        assert not stream.released
        with pytest.raises(SessionLockedError):
            second.take()
        first.truncate(len(PROMPT))
        first.release()
        assert retry_held(second.take, s.session_id) is None  # (the release was sent without waiting)
        second.release()
        assert s.tokens() == PROMPT


def test_a_hold_fenced_to_another_tenant_is_refused_as_unknown(manager) -> None:
    with manager.open_session(backend="b0", session_id=f"h-{uuid.uuid4().hex[:8]}") as s:
        s.append(PROMPT)
        fenced = _held(manager, s.session_id, fence=("acme",))
        with pytest.raises(OtherTenantsSessionError):
            list(fenced.stream(2, ignore_eos=True))
        with pytest.raises(ApiError) as refused:
            retry_held(lambda: list(fenced.stream(2, ignore_eos=True)), s.session_id)
        assert (refused.value.status, refused.value.code) == (409, "session_exists")
        own = _held(manager, s.session_id, fence=(None,))  # the session's own tenant (none)
        assert len(list(own.stream(2, ignore_eos=True))) == 2 and len(s.tokens()) == len(PROMPT) + 2


def test_a_remembered_session_moved_meanwhile_is_followed(manager) -> None:
    with manager.open_session(backend="b0", session_id=f"r-{uuid.uuid4().hex[:8]}") as s:
        s.append(PROMPT)
        s.migrate("b1")
        remembered = _held(manager, s.session_id)
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

    remembered = _held(manager, sid, reopen=reopen)
    got = list(remembered.stream(4, ignore_eos=True, prompt=PROMPT))
    assert opened == [sid] and remembered.backend == "b1"
    assert manager.session(sid).tokens() == PROMPT + got  # the turn ran on the session opened again
    manager.session(sid).close()
    with pytest.raises(Exception, match=sid):  # gone again: reopened once only, then the error stands
        remembered.tokens()
