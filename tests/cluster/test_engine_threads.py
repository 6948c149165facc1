"""A backend's engine threads sleep between steps (``OMP_WAIT_POLICY=PASSIVE``) unless the
environment kvres is started from says how they wait: the variable reaches the backend actor's
process (read from ``/proc``, the process Ray started for it)."""

from __future__ import annotations

from pathlib import Path

import ray

from kvres.actors.backend_setup.engine_threads import engine_process_env
from kvres.actors.ray_actors.backend_actor import backend_actor_name


def test_passive_unless_the_environment_says_otherwise() -> None:
    assert engine_process_env({}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert engine_process_env({"OMP_WAIT_POLICY": "ACTIVE"}) == {"OMP_WAIT_POLICY": "ACTIVE"}
    assert engine_process_env({"GOMP_SPINCOUNT": "10000", "OMP_WAIT_POLICY": ""}) == {"GOMP_SPINCOUNT": "10000"}


def test_the_backend_process_starts_with_it(manager) -> None:
    backend = ray.get_actor(backend_actor_name("b0"), namespace=manager.namespace)
    pid = ray.get(backend.pid.remote(), timeout=60)
    environ = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)
    assert environ.get("OMP_WAIT_POLICY") == "PASSIVE", sorted(environ)
