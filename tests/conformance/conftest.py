"""Executors under conformance test: every ``executors_*.py`` here contributes ``FACTORIES``.

A factory is a zero-argument callable returning a fresh executor; ``VOCAB`` of a module bounds the
token ids its executors accept (the scenarios use ids well inside every vocabulary).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

_HERE = Path(__file__).parent


def _factories() -> dict[str, Callable[[], Any]]:
    found: dict[str, Callable[[], Any]] = {}
    for path in sorted(_HERE.glob("executors_*.py")):
        module = importlib.import_module(f"tests.conformance.{path.stem}")
        found.update(module.FACTORIES)
    return found


FACTORIES = _factories()


@pytest.fixture(params=sorted(FACTORIES))
def make_executor(request: pytest.FixtureRequest) -> Callable[[], Any]:
    return FACTORIES[request.param]
