"""An id the planner's directory lists on a backend that does not have it: what an opener leaves when
it dies between placing a session and its backend opening it (under ``kvres serve --front local``,
a backend killed during a conversation's first turn takes the front that was opening it along).
No opening with that id could succeed before, and the HTTP front answered its turns 404, then 409.
Now the id opens (or a file restores under it) where it is listed, once (a second opening is
refused; an id its backend has keeps its listing), and a bound request's first turn
(``Service.bound``) runs on it at once. Through ``kvres.cluster`` sessions on a local Ray cluster
(llama.cpp backends b0 and b1)."""

from __future__ import annotations

import threading
import uuid

import pytest

from kvres.policy import SessionExistsError, UnknownSessionError
from tests.conftest import shared_model_path

PROMPT = list(range(3, 23))


def _listed_by_a_dead_opener(manager, backend: str) -> str:
    sid = f"dead-opener-{uuid.uuid4().hex[:8]}"
    manager.planner_client.register(sid, backend)  # what the placement wrote before the opener died
    with pytest.raises(UnknownSessionError, match=sid):
        manager.session(sid).tokens()
    return sid


def test_an_id_a_dead_opener_listed_opens_where_it_is_listed_once(manager) -> None:
    sid = _listed_by_a_dead_opener(manager, "b1")
    session = manager.open_session(model=shared_model_path(), session_id=sid)
    assert session.backend == "b1"
    session.append(PROMPT)
    with pytest.raises(SessionExistsError, match=sid):
        manager.open_session(model=shared_model_path(), session_id=sid)
    assert manager.session(sid).backend == "b1" and manager.session(sid).tokens() == PROMPT
    session.close()


def test_a_file_restores_under_an_id_a_dead_opener_listed(manager, tmp_path) -> None:
    exported = manager.open_session(model=shared_model_path())
    exported.append(PROMPT)
    path = exported.export(tmp_path / "s.kvsession")
    exported.close()
    sid = _listed_by_a_dead_opener(manager, "b0")
    restored = manager.restore(path, session_id=sid, model=shared_model_path())
    assert restored.backend == "b0" and restored.tokens() == PROMPT
    with pytest.raises(SessionExistsError, match=sid):
        manager.restore(path, session_id=sid, model=shared_model_path())
    assert manager.session(sid).tokens() == PROMPT
    restored.close()


def test_an_id_listed_on_a_backend_of_another_model_stays_refused(manager) -> None:
    sid = _listed_by_a_dead_opener(manager, "pk")
    try:
        with pytest.raises(SessionExistsError, match=sid):
            manager.open_session(model=shared_model_path(), session_id=sid)
        assert manager.planner_client.where(sid) == "pk"
    finally:
        manager.planner_client.forget(sid)


def test_openings_of_one_id_at_once_open_it_once_and_keep_it_listed(manager) -> None:
    sid = f"raced-{uuid.uuid4().hex[:8]}"
    openers = 6
    barrier = threading.Barrier(openers)
    outcomes: list[str | None] = []

    def open_one() -> None:
        barrier.wait()
        try:
            outcomes.append(manager.open_session(model=shared_model_path(), session_id=sid).backend)
        except SessionExistsError:
            outcomes.append(None)

    threads = [threading.Thread(target=open_one) for _ in range(openers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    opened = [backend for backend in outcomes if backend is not None]
    assert len(outcomes) == openers and len(opened) == 1, outcomes
    session = manager.session(sid)
    assert session.backend == opened[0]
    session.append(PROMPT)
    assert session.tokens() == PROMPT
    session.close()


def test_a_bound_first_turn_on_an_id_a_dead_opener_listed_runs_at_once(manager) -> None:
    from kvres.cluster.serve.service import Service

    service = Service(manager.namespace, manager.config)
    try:
        model = service.catalog.of_backend("b0")
        sid = _listed_by_a_dead_opener(manager, "b0")
        session, stack = service.bound(model, None, sid)
        with stack:
            got = list(session.stream(4, ignore_eos=True, prompt=PROMPT))
        assert session.backend == "b0" and manager.session(sid).tokens() == PROMPT + got
        session, stack = service.bound(model, None, sid)  # the next turn: where it ran, nothing opened again
        with stack:
            more = list(session.stream(4, ignore_eos=True, prompt=PROMPT))
        assert manager.session(sid).tokens() == PROMPT + got + PROMPT + more
        manager.session(sid).close()
    finally:
        service.close()
