"""The backend's operations are declared once (``kvres.actors.host.backend_surface.BackendSurface``) and the
driver's session operations once (``kvres.cluster.session_surface.SessionSurface``): the host, the Ray
shell, the driver's client and ``Session`` are checked against them.

mypy (``make typecheck``) checks every declared operation's parameters by position, kind and type,
and its answer; it does not compare the names of positional parameters, which these tests do. The
slow test edits a copy of the code to prove that mypy fails when any of the four classes drifts.
"""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvres.actors.host.backend import BackendHost
from kvres.actors.host.backend_surface import BackendSurface
from kvres.actors.ray_actors.backend_actor import BackendServer
from kvres.cluster.backend_client import BackendClient
from kvres.cluster.session_handle import Session
from kvres.cluster.session_surface import NOT_ON_SESSION, SESSION_FORWARDS, SessionSurface

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("policy", "coldstore", "actors", "cluster", "testing")


def _operations(surface: type) -> list[str]:
    return [name for name, value in vars(surface).items() if inspect.isfunction(value) and not name.startswith("_")]


def _parameters(function: Callable[..., Any]) -> list[inspect.Parameter]:
    return list(inspect.signature(function).parameters.values())[1:]  # self left out


def test_every_session_operation_names_the_backend_operations_it_reaches() -> None:
    backend_ops, session_ops = set(_operations(BackendSurface)), set(_operations(SessionSurface))
    reached = {op for ops in SESSION_FORWARDS.values() for op in ops}
    assert set(SESSION_FORWARDS) == session_ops, "SESSION_FORWARDS and SessionSurface list different operations"
    assert reached <= backend_ops, f"not backend operations: {sorted(reached - backend_ops)}"
    assert not reached & set(NOT_ON_SESSION), f"reached by a session and listed as not: {sorted(reached & set(NOT_ON_SESSION))}"
    assert reached | set(NOT_ON_SESSION) == backend_ops, \
        f"backend operations no table names: {sorted(backend_ops - reached - set(NOT_ON_SESSION))}"
    public = {name for name, value in vars(Session).items() if inspect.isfunction(value) and not name.startswith("_")}
    assert public == session_ops, f"Session's operations differ from SessionSurface: {sorted(public ^ session_ops)}"


@pytest.mark.parametrize("cls", [BackendHost, BackendServer, BackendClient], ids=lambda c: c.__name__)
def test_backend_classes_name_the_declared_parameters_as_declared(cls: type) -> None:
    """The declared parameters come first, under their declared names, kinds and defaults; what a
    class adds comes after them, keyword-only or defaulted."""
    for op in _operations(BackendSurface):
        declared, actual = _parameters(getattr(BackendSurface, op)), _parameters(getattr(cls, op))
        head = actual[: len(declared)]
        assert [(p.name, p.kind) for p in head] == [(p.name, p.kind) for p in declared], f"{cls.__name__}.{op}"
        for want, got in zip(declared, head, strict=True):
            if want.default is not inspect.Parameter.empty:
                assert got.default == want.default, f"{cls.__name__}.{op}: default of {want.name}"
        for extra in actual[len(declared):]:
            assert extra.kind is inspect.Parameter.KEYWORD_ONLY or extra.default is not inspect.Parameter.empty, \
                f"{cls.__name__}.{op}: {extra.name} is required and not declared"


def test_session_names_its_parameters_as_declared() -> None:
    for op in _operations(SessionSurface):
        declared, actual = _parameters(getattr(SessionSurface, op)), _parameters(getattr(Session, op))
        assert [(p.name, p.kind, p.default) for p in actual] == [(p.name, p.kind, p.default) for p in declared], \
            f"Session.{op}"


def test_the_ray_shell_keeps_its_method_options() -> None:
    """The shell's methods are marked with ``ray.method`` through a wrapper that keeps their type:
    the marks are the ones they always had."""
    calls = {"append", "append_text", "generate", "stream", "chat", "append_messages"}
    marked = {name: value.__ray_concurrency_group__ for name, value in vars(BackendServer).items()
              if hasattr(value, "__ray_concurrency_group__")}
    control = set(_operations(BackendSurface)) - calls | {"ping", "pid", "stats", "host_front", "stop_front", "hold",
                                                          "release_hold", "renew_holds"}
    assert marked == {name: "calls" if name in calls else "control" for name in calls | control}
    assert BackendServer.stream.__ray_num_returns__ == "streaming"
    assert not any(hasattr(value, "__ray_num_returns__") for name, value in vars(BackendServer).items()
                   if name != "stream")


# One signature edit per class, each one that only the declaration catches (no typed caller breaks).
DRIFTS = {
    "BackendHost": ("actors/host/backend.py", "detokenize",
                    "def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:",
                    "def detokenize(self, tokens: Sequence[int], special: bool) -> str:"),
    "BackendServer": ("actors/ray_actors/backend_actor.py", "export",
                      "def export(self, session_id: str) -> bytes:",
                      "def export(self, session_id: str) -> bytes | None:"),
    "BackendClient": ("cluster/backend_client.py", "tokenize",
                      "def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:",
                      "def tokenize(self, text: str, add_bos: bool = True, special: str = \"\") -> list[int]:"),
    "Session": ("cluster/session_handle.py", "export",
                "def export(self, path: str | os.PathLike[str]) -> Path:",
                "def export(self, path: str) -> Path:"),
}


@pytest.mark.slow
def test_mypy_fails_when_any_surface_drifts(tmp_path: Path) -> None:
    """A copy of the five packages laid out as ``make typecheck`` lays them out, one method of each
    of the four classes changed: mypy strict, with the project's configuration, names each class
    and its method. (The unchanged code passing is ``make typecheck`` itself.)"""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / "kvres" / package, ignore=shutil.ignore_patterns("__pycache__"))
    for path, _, before, after in DRIFTS.values():
        source = tmp_path / "kvres" / path
        text = source.read_text()
        assert text.count(before) == 1, f"{path}: {before!r} is not there once"
        source.write_text(text.replace(before, after))
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(tmp_path / "mypy-cache"), *(arg for p in PACKAGES for arg in ("-p", f"kvres.{p}"))],
        cwd=tmp_path, capture_output=True, text=True, timeout=900)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    for cls, (path, method, _, _) in DRIFTS.items():
        # the check's error and the notes under it, up to the next error
        found = re.search(rf'^kvres/{re.escape(path)}:\d+: error: Incompatible return value type '
                          rf'\(got "{cls}", expected "(Backend|Session)Surface.*?(?=^\S+: error:|\Z)', out, re.M | re.S)
        assert found is not None, f"mypy did not report {cls} against its declaration:\n{out}"
        assert re.search(rf"def {method}\(", found.group(0)), f"{cls}: the report does not name {method}:\n{out}"
