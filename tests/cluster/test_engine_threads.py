"""How a backend's engine threads wait between steps is the operator's: ``OMP_WAIT_POLICY`` /
``GOMP_SPINCOUNT`` of the environment kvres starts backends from, and nothing else, go into the
backend actor's ``runtime_env`` (kvres.actors.backend_setup.engine_threads)."""

from __future__ import annotations

from kvres.actors.backend_setup.engine_threads import engine_process_env


def test_only_what_the_environment_sets() -> None:
    assert engine_process_env({}) == {}
    assert engine_process_env({"OMP_WAIT_POLICY": "PASSIVE", "PATH": "/bin"}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert engine_process_env({"GOMP_SPINCOUNT": "10000", "OMP_WAIT_POLICY": ""}) == {"GOMP_SPINCOUNT": "10000"}
