"""How a backend process's engine threads wait between steps.

Primitives:
- ``WAIT_VARIABLES``: the environment variables that set it (OpenMP's ``OMP_WAIT_POLICY``,
  libgomp's ``GOMP_SPINCOUNT``).
- ``engine_process_env(environ=os.environ) -> dict[str, str]``: the ones ``environ`` sets, which a
  backend's process starts with (its Ray actor's ``runtime_env``), wherever Ray places it.

Why it is the operator's choice: llama.cpp's CPU backend (the pinned llama-cpp-python builds it with
OpenMP) runs each decode as an OpenMP parallel region; between two regions libgomp's threads spin
(300,000 rounds by default) before they sleep. Measured on the 2-core machine (2 engine threads, 4
sessions, turns of 32 + 16 on stories260K, interleaved, 2026-12-05), wall / CPU ms per turn:

| | quiet machine | 2 other busy processes |
|---|---|---|
| libgomp's default (spin) | 20-23 / 41-45 | 127-305 / 127-299 |
| ``OMP_WAIT_POLICY=PASSIVE`` | 46-55 / 60-68 | 55-94 / 52-65 |
| ``GOMP_SPINCOUNT=10000`` | 30-31 / 55-58 | 73-96 / 58-83 |

Spinning is fastest where the engine has its cores to itself and ruinous where it shares them (the
spinning threads take the cores the step loop, the HTTP front and Ray need): kvres leaves libgomp's
default and passes an operator's setting on to every backend it starts (docs/operators.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def engine_process_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    return {name: env[name] for name in WAIT_VARIABLES if env.get(name)}
