"""Nothing kept per call in Ray's GCS: the clusters kvres starts bound Ray's task-event store, and
kvres's actors report no task events; Ray's upkeep there is kept small (read back from Ray: the
GCS's system configuration, the task events it holds, the log monitor's environment). The standing
cluster's and ``kvres serve``'s checks are beside their fixtures (tests/cluster/test_standing_cluster.py,
tests/serve/test_task_events.py)."""

from __future__ import annotations

import json
import os
import time

import pytest

from kvres.cluster.ray_task_events import (
    TASK_EVENT_STORE,
    SystemConfigError,
    actor_task_events,
    ray_start_arguments,
    started_cluster_config,
)
from kvres.cluster.ray_upkeep import (
    UPKEEP_CONFIG,
    UPKEEP_ENVIRONMENT,
    started_with_upkeep,
    upkeep_environment,
)
from tests.cluster.task_event_probe import TASK_EVENT_KEYS, log_monitor_environment, read_task_events

PROMPT = list(range(3, 103))
RAY_DEFAULT_CAP = 100_000  # Ray's task_events_max_num_task_in_gcs


def test_an_embedded_cluster_bounds_the_store_and_kvres_actors_report_no_task_events(manager) -> None:
    import ray

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
    assert seen["upkeep"] == UPKEEP_CONFIG, seen
    assert log_monitor_environment(ray.get_runtime_context().gcs_address).items() >= UPKEEP_ENVIRONMENT.items()


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
    assert started_cluster_config() == {**UPKEEP_CONFIG, **TASK_EVENT_STORE}
    given = {"task_events_max_num_task_in_gcs": 500, "object_timeout_milliseconds": 9, "event_stats": True}
    assert started_cluster_config(given) == {**TASK_EVENT_STORE, **given}  # the caller's own win
    monkeypatch.setenv("KVRES_RAY_TASK_EVENTS", "1")  # Ray's defaults for task events: events reported
    assert actor_task_events() == {"enable_task_events": True}
    assert started_cluster_config() == dict(UPKEEP_CONFIG) and started_cluster_config(given) == given


def test_ray_start_gets_one_system_config_merged_with_a_given_one(monkeypatch) -> None:
    monkeypatch.delenv("KVRES_RAY_TASK_EVENTS", raising=False)

    def system_config(args: list[str]) -> dict[str, object]:
        flags = [a for a in args if a.startswith("--system-config")]
        assert len(flags) == 1, args
        return dict(json.loads(flags[0].split("=", 1)[1]))

    plain = ray_start_arguments(["--metrics-export-port=8080"])
    assert plain[0] == "--metrics-export-port=8080"
    assert system_config(plain) == {**UPKEEP_CONFIG, **TASK_EVENT_STORE}
    for given in (['--system-config={"task_events_max_num_task_in_gcs": 7, "x": 1}'],
                  ["--system-config", '{"task_events_max_num_task_in_gcs": 7, "x": 1}']):
        assert system_config(ray_start_arguments(given)) == {**UPKEEP_CONFIG, **TASK_EVENT_STORE,
                                                             "task_events_max_num_task_in_gcs": 7, "x": 1}
    with pytest.raises(SystemConfigError, match=r"--system-config must be a JSON object, got '\[1\]'"):
        ray_start_arguments(["--system-config=[1]"])
    monkeypatch.setenv("KVRES_RAY_TASK_EVENTS", "1")
    assert ray_start_arguments(["--num-gpus=0"]) == ["--num-gpus=0", '--system-config={"event_stats":false}']


def test_the_upkeep_environment_is_added_under_what_is_set_and_only_while_a_cluster_starts(monkeypatch) -> None:
    (name, value), = UPKEEP_ENVIRONMENT.items()
    assert upkeep_environment({"PATH": "/bin"}) == {"PATH": "/bin", name: value}
    assert upkeep_environment({name: "1000"})[name] == "1000"  # one already set keeps its value
    monkeypatch.delenv(name, raising=False)
    with started_with_upkeep():
        assert os.environ[name] == value
    assert name not in os.environ  # as it was after
    monkeypatch.setenv(name, "7")
    with started_with_upkeep():
        assert os.environ[name] == "7"
    assert os.environ[name] == "7"
