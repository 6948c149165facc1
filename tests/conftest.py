"""Shared fixtures: the shared test model, a guard that keeps engines to one thread each, and
``wait_until`` (poll a condition with a deadline)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

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


@pytest.fixture(scope="session")
def stories_model() -> Path:
    return shared_model_path()


@pytest.fixture(autouse=True, scope="session")
def _quiet_threads() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def wait_until(condition: Callable[[], bool], timeout_s: float = 20.0, every_s: float = 0.05) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every_s)
    return False
