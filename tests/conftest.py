"""Shared fixtures: the hypothesis profile (``tests/hypothesis_profiles.py``: a fixed seed unless
``KVRES_HYPOTHESIS_PROFILE=fuzz``), the shared test model, a guard that keeps engines to one thread
each, ``wait_until`` (poll a condition with a deadline), ``local_host(config, cold_dir)`` (a
backend host on the real engine over a local cold store, stopped and closed after the test that
made it) and ``free_port()`` (a port nothing listens on, drawn between Ray's default worker ports
and the system's ephemeral range: a port the system handed out for a bind to 0 may be taken, before
the test listens on it, by any outgoing connection of the machine, and a Ray head's GCS then fails
to start)."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hypothesis_profiles import load_profile

load_profile()  # before any test module builds its @settings: they inherit the profile's

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_MODEL = REPO_ROOT.parent / "shared" / "models" / "stories260K.gguf"


def shared_model_path() -> Path:
    """../shared/models/stories260K.gguf, or a failure that says it is missing (never a skip)."""
    if not SHARED_MODEL.is_file():
        pytest.fail(
            f"test model missing: {SHARED_MODEL} (tests and CI expect ../shared/models/stories260K.gguf "
            "beside the repository)",
            pytrace=False,
        )
    return SHARED_MODEL


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_draw = random.Random()  # its own generator: hypothesis and seeded tests must not change the draws


def free_port() -> int:
    from kvres.cluster.head_ports import FIXED_DEFAULTS, bindable
    from kvres.cluster.reachability import DEFAULT_PORT

    low, high = 20000, _ephemeral_floor() - 1  # above Ray's default worker ports (10002-19999)
    if high <= low:
        raise RuntimeError(f"no port range between Ray's worker ports and the ephemeral ones: {low}..{high}")
    taken = {DEFAULT_PORT, *FIXED_DEFAULTS.values()}  # a Ray head's own defaults
    for _ in range(200):
        port = _draw.randint(low, high)
        if port not in taken and bindable("127.0.0.1", port):
            return port
    raise RuntimeError(f"no free port in {low}..{high} after 200 draws")


@pytest.fixture(scope="session")
def stories_model() -> Path:
    return shared_model_path()


@pytest.fixture(autouse=True, scope="session")
def _quiet_threads() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")


_hosts: list[Any] = []  # made by local_host: closed after each test, no engine left for the interpreter's exit


def local_host(config: Any, cold_dir: Path | None, **options: Any) -> Any:
    """A ``BackendHost`` for ``config`` (its model) with a RAM + disk cold store in ``cold_dir`` (None:
    no store), ``options`` passed on; shut down after the test."""
    from kvres.actors.backend_setup.engine_registry import make_executor
    from kvres.actors.host.backend import BackendHost
    from kvres.actors.ray_actors.coldstore_actor import ColdStoreServer
    from kvres.testing import LocalStorePort

    store = None if cold_dir is None else LocalStorePort("n", {"n": ColdStoreServer(16 << 20, cold_dir, 64 << 20)})
    host = BackendHost(config, make_executor(config, config.model_path), store=store, **options)
    _hosts.append(host)
    return host


@pytest.fixture(autouse=True)
def _close_local_hosts() -> Iterator[None]:
    yield
    while _hosts:
        _hosts.pop().shutdown()


def wait_until(condition: Callable[[], bool], timeout_s: float = 20.0, every_s: float = 0.05) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every_s)
    return False
