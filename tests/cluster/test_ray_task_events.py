"""Nothing kept per call in Ray's GCS: the clusters kvres starts bound Ray's task-event store, and
kvres's actors report no task events (read back from Ray: the GCS's system configuration and the
task events it holds). The standing cluster's and ``kvres serve``'s checks are beside their
fixtures (tests/cluster/test_standing_cluster.py, tests/serve/test_task_events.py)."""

from __future__ import annotations

import json
import time

import pytest

from kvres.cluster.ray_task_events import (
    TASK_EVENT_STORE,
    SystemConfigError,
    actor_task_events,
    ray_start_arguments,
    started_cluster_config,
)
from tests.cluster.task_event_probe import TASK_EVENT_KEYS, read_task_events

PROMPT = list(range(3, 103))
RAY_DEFAULT_CAP = 100_000  # Ray's task_events_max_num_task_in_gcs


def test_an_embedded_cluster_bounds_the_store_and_kvres_actors_report_no_task_events(manager) -> None:
    session = manager.open_session(backend="b0")  # the planner, a backend and (closing) the cold stores
    session.append(PROMPT)
    assert len(session.generate(8)) == 8
    assert len(list(session.stream(4))) == 4
    session.close()
    seen = read_task_events()
    assert seen["witnessed"], seen  # this driver's own task reached the GCS: the calls before it did too
    assert seen["kvres_task_events"] == [], seen
    bound = seen["system_config"]
    assert bound == {key: TASK_EVENT_STORE[key] for key in TASK_EVENT_KEYS}, bound
    assert bound["task_events_max_num_task_in_gcs"] < RAY_DEFAULT_CAP


def test_a_long_lived_task_keeps_a_bounded_number_of_profile_events(manager) -> None:
    """The driver is one task whose record collects a ``submit_task`` span per call it makes (Ray
    keeps 1,000 of them per task, and with actors restarting such records grew the GCS: operators.md,
    the GCS under faults); the clusters kvres starts keep 16."""
    import ray

    @ray.remote(num_cpus=0)
    def nothing() -> int:
        return 0

    for _ in range(3):  # reported in several batches: the GCS merges them into the driver's record
        ray.get([nothing.remote() for _ in range(40)])
        time.sleep(1.2)
    seen = read_task_events()
    bound = TASK_EVENT_STORE["task_events_max_num_profile_events_per_task"]
    assert seen["witnessed"], seen
    assert 0 < seen["most_profile_events"] <= bound, seen


def test_kvres_settings_and_ray_defaults(monkeypatch) -> None:
    monkeypatch.delenv("KVRES_RAY_TASK_EVENTS", raising=False)
    assert actor_task_events() == {"enable_task_events": False}
    assert started_cluster_config() == dict(TASK_EVENT_STORE)
    given = {"task_events_max_num_task_in_gcs": 500, "object_timeout_milliseconds": 9}
    assert started_cluster_config(given) == {**TASK_EVENT_STORE, **given}  # the caller's own win
    monkeypatch.setenv("KVRES_RAY_TASK_EVENTS", "1")  # Ray's defaults: nothing set, events reported
    assert actor_task_events() == {"enable_task_events": True}
    assert started_cluster_config() == {} and started_cluster_config(given) == given


def test_ray_start_gets_one_system_config_merged_with_a_given_one(monkeypatch) -> None:
    monkeypatch.delenv("KVRES_RAY_TASK_EVENTS", raising=False)

    def system_config(args: list[str]) -> dict[str, object]:
        flags = [a for a in args if a.startswith("--system-config")]
        assert len(flags) == 1, args
        return dict(json.loads(flags[0].split("=", 1)[1]))

    plain = ray_start_arguments(["--metrics-export-port=8080"])
    assert plain[0] == "--metrics-export-port=8080" and system_config(plain) == dict(TASK_EVENT_STORE)
    for given in (['--system-config={"task_events_max_num_task_in_gcs": 7, "x": 1}'],
                  ["--system-config", '{"task_events_max_num_task_in_gcs": 7, "x": 1}']):
        assert system_config(ray_start_arguments(given)) == {**TASK_EVENT_STORE, "task_events_max_num_task_in_gcs": 7,
                                                             "x": 1}
    with pytest.raises(SystemConfigError, match=r"--system-config must be a JSON object, got '\[1\]'"):
        ray_start_arguments(["--system-config=[1]"])
    monkeypatch.setenv("KVRES_RAY_TASK_EVENTS", "1")
    assert ray_start_arguments(["--num-gpus=0"]) == ["--num-gpus=0"]
