"""Placement through the planner actor: open_session costs the same Ray calls whatever the number
of backends, the choice comes from the load view, and the real cluster places by model, engine,
policy and label."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
import ray

from kvres.actors.ray_actors.planner_actor import PlannerActor
from kvres.cluster import BackendConfig, KvresConfig, SessionPolicy
from kvres.cluster.ray_task_events import actor_task_events
from kvres.cluster.session import SessionManager
from kvres.policy import KvresError, SessionExistsError
from kvres.policy.placement import LoadReport, PlacementError, PlacementPolicy
from tests.conftest import shared_model_path


class Counted:
    """A handle whose method calls (``handle.method.remote(...)``) are counted by name."""

    def __init__(self, target: Any, calls: Counter[str], prefix: str) -> None:
        self._target, self._calls, self._prefix = target, calls, prefix

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._target, name)
        calls, key = self._calls, f"{self._prefix}.{name}"

        class Remote:
            def remote(self, *args: Any, **kwargs: Any) -> Any:
                calls[key] += 1
                return method.remote(*args, **kwargs)

        return Remote()


class FakeBackend:
    """Stands in for a backend actor: opening a session succeeds once per id, nothing else is expected."""

    def __init__(self) -> None:
        self.opened: set[str] = set()

    def open_session(self, session_id: str, policy: Any) -> None:
        if session_id in self.opened:
            raise SessionExistsError(session_id)
        self.opened.add(session_id)

    def stats(self) -> dict[str, Any]:
        raise AssertionError("placement must not ask backends for their stats")


class Local:
    """``method.remote`` on a plain object: the result as an object ref."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._target, name)

        class Remote:
            def remote(self, *args: Any, **kwargs: Any) -> Any:
                return ray.put(method(*args, **kwargs))

        return Remote()


def manager_over(n_backends: int, calls: Counter[str]) -> SessionManager:
    """A SessionManager of ``n_backends`` fake backends and a real planner actor of its own."""
    model = shared_model_path()
    config = KvresConfig(backends=[BackendConfig(name=f"b{i}", model_path=model, n_ctx=256, kv_budget_tokens=256)
                                   for i in range(n_backends)])
    mgr = SessionManager.__new__(SessionManager)
    mgr._lease = None  # no driver lease: nothing streams here
    mgr.namespace, mgr.config, mgr._started_ray, mgr.cold_stores = "fake", config, False, {}
    mgr.planner = Counted(PlannerActor.options(num_cpus=0, **actor_task_events()).remote(), calls, "planner")
    mgr._backends = {b.name: Counted(Local(FakeBackend()), calls, b.name) for b in config.backends}
    return mgr


def test_open_session_makes_the_same_ray_calls_with_1_and_16_backends(manager, monkeypatch) -> None:
    real_get = ray.get
    per_size = {}
    for n in (1, 16):
        calls: Counter[str] = Counter()
        mgr = manager_over(n, calls)

        def counting_get(refs: Any, *args: Any, calls: Counter[str] = calls, **kwargs: Any) -> Any:
            calls["ray.get"] += 1
            return real_get(refs, *args, **kwargs)

        monkeypatch.setattr(ray, "get", counting_get)
        sessions = [mgr.open_session(policy=SessionPolicy.streaming(128, recent_tokens=32)) for _ in range(4)]
        monkeypatch.setattr(ray, "get", real_get)
        backend_calls = sum(v for k, v in calls.items() if k.startswith("b"))
        per_size[n] = (calls["ray.get"], calls["planner.place"], backend_calls, sum(calls.values()))
        assert len({s.backend for s in sessions}) == min(n, 4)  # a burst spreads out: pending counts
        directory = real_get(mgr.planner.directory.remote())
        assert directory == {s.session_id: s.backend for s in sessions}
    assert per_size[1] == per_size[16] == (8, 4, 4, 16)  # per open: place + open_session, one get each


def test_a_failed_opening_leaves_nothing_pending(manager) -> None:
    calls: Counter[str] = Counter()
    mgr = manager_over(2, calls)
    mgr.open_session(session_id="taken")
    with pytest.raises(SessionExistsError, match="taken"):
        mgr.open_session(session_id="taken")
    with pytest.raises(PlacementError, match="no backend serves model 'other.gguf'"):
        mgr.open_session(model="other.gguf")
    load = ray.get(mgr.planner.load.remote())
    assert load["totals"]["pending_sessions"] == 1 and load["totals"]["backends"] == 2


def test_the_real_cluster_places_by_model_engine_and_policy(manager) -> None:
    engine = manager.open_session(policy=SessionPolicy.engine_evicts(96, recent_tokens=32))
    assert engine.backend == "genai"
    spread = [manager.open_session(model=shared_model_path().name) for _ in range(3)]
    assert len({s.backend for s in spread}) == 3
    streaming = SessionPolicy.streaming(128, recent_tokens=32)
    packed = [manager.open_session(policy=streaming, placement="pack") for _ in range(2)]
    assert [s.backend for s in packed] == ["small", "small"]  # the fullest backend that fits
    packed[0].append(list(range(3, 103)))
    assert packed[0].stats()["resident_tokens"] == 100
    with pytest.raises(KvresError, match="no backend serves model 'missing.gguf'"):
        manager.open_session(model="missing.gguf")
    status = manager.status(detail=False)
    assert {b["backend"] for b in status["backends"]} == set(manager.backends())
    assert status["load"]["totals"]["backends"] == len(manager.backends())
    assert {b["backend"] for b in manager.status()["backends"]} == set(manager.backends())
    for s in [engine, *spread, *packed]:
        s.close()
    assert not set(ray.get(manager.planner.directory.remote())) & {s.session_id for s in spread}


def test_label_placement_follows_the_labels_backends_report(manager) -> None:
    with pytest.raises(PlacementError, match="labelled"):
        manager.open_session(placement=PlacementPolicy("label", {"kvres-test-zone": "z1"}))
    stats = ray.get(manager.backend_handle("b1").stats.remote())
    ray.get(manager.planner.report_load.remote(LoadReport(
        "b1", stats["kv_budget_tokens"], stats["resident_tokens"], n_seq_max=6, model=stats["model"],
        engine="llama", node=stats["node_id"], labels={"kvres-test-zone": "z1"}, at=time.time())))
    session = manager.open_session(placement=PlacementPolicy("label", {"kvres-test-zone": "z1"}))
    assert session.backend == "b1"
    session.close()
    calls = ray.get(manager.planner.stats.remote())["calls"]
    assert calls["report_load"] >= 1 and calls["place"] >= 2


class _Counts:
    """What a backend's host tells its reporter: (resident tokens, live, suspended)."""

    def __init__(self) -> None:
        self.now = (0, 0, 0)

    def load(self) -> tuple[int, int, int]:
        return self.now


def test_load_reports_reach_the_planner_from_one_thread_and_a_held_change_goes_by_itself(manager) -> None:
    from kvres.actors.ray_actors.load_reports import LoadReporter
    from kvres.actors.ray_actors.planner_actor import PLANNER_NAME

    namespace = f"{manager.namespace}-reports"
    planner = PlannerActor.options(name=PLANNER_NAME, namespace=namespace, **actor_task_events()).remote()
    try:
        reporter = LoadReporter(BackendConfig(name="reporting", kv_budget_tokens=1000), "m.gguf", "node", namespace)

        def reported() -> tuple[int, int] | None:
            rows = [b for b in ray.get(planner.load.remote())["backends"] if b["backend"] == "reporting"]
            return (rows[0]["resident_tokens"], rows[0]["live_sessions"]) if rows else None

        pushed_from: list[threading.Thread] = []
        push = reporter._push
        reporter._push = lambda report: (pushed_from.append(threading.current_thread()), push(report))  # type: ignore[method-assign]
        counts = _Counts()

        def burst(live: int, last: int) -> None:
            for resident in range(100, last + 1, 100):  # changes within the rate limit: the last is held
                counts.now = (resident, live, 0)
                reporter.changed(counts)
            deadline = time.monotonic() + 20
            while reported() != (last, live) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert reported() == (last, live)  # the last change arrived although nothing came after it

        burst(1, 900)
        burst(2, 500)
        # every push left from the one reporter thread: none from the changing calls, none from a
        # thread started per held report
        assert len(pushed_from) >= 2 and len({id(t) for t in pushed_from}) == 1
        assert pushed_from[0] is not threading.current_thread()
    finally:
        ray.kill(planner)
