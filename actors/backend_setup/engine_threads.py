"""How a backend process's engine threads wait between steps.

Primitives:
- ``WAIT_VARIABLES``: the environment variables that set it (OpenMP's ``OMP_WAIT_POLICY``,
  libgomp's ``GOMP_SPINCOUNT``).
- ``engine_process_env(environ=os.environ) -> dict[str, str]``: the variables a backend's process
  starts with (its Ray actor's ``runtime_env``): the ones ``environ`` sets, passed on as they are,
  else ``OMP_WAIT_POLICY=PASSIVE``.

Why: llama.cpp's CPU backend (the pinned llama-cpp-python builds it with OpenMP) runs each decode
as an OpenMP parallel region; between two regions libgomp's threads spin (300,000 rounds by
default) before they sleep. A backend step spends part of its time in Python between decodes (the
step loop, sampling, the streams' hand-offs), and there the spinning threads take the cores the
step loop, the HTTP front and Ray need. On the 2-core machine (2 engine threads, 4 sessions, turns
of 32 + 16 on stories260K, a loaded machine, interleaved): 78-290 CPU ms per turn spinning, 50-55
passive (1 thread: 27-44). A passive thread wakes in microseconds when the next decode starts,
which is nothing beside a step. A GPU backend's threads hardly wait this way; the setting is the
same there and costs nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
DEFAULT_WAIT = {"OMP_WAIT_POLICY": "PASSIVE"}


def engine_process_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    given = {name: env[name] for name in WAIT_VARIABLES if env.get(name)}
    return given or dict(DEFAULT_WAIT)
