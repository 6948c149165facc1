"""The versions kvres is tested with where it depends on another project's internals.

Primitives:
- ``LLAMA_CPP_PYTHON``: the llama-cpp-python version whose sequence-state layout
  ``kvres.actors.engines.llama.state_blob`` parses (pyproject.toml pins exactly this one).
- ``RAY_FLOOR``: the oldest Ray whose APIs kvres uses (token authentication, ``ray._private``
  helpers); pyproject.toml's floor.
- ``installed_version(distribution) -> str | None``.
- ``check_llama_cpp_python(installed=None)``: raises ``EngineVersionError`` naming both versions
  when another llama-cpp-python is installed (a state blob of another version could be misread
  or refused, so the engine is not started on it); ``installed`` is read from the environment
  when not given.
- ``EngineVersionError``: a typed ``KvresError``.
"""

from __future__ import annotations

from importlib import metadata

from kvres.policy.errors import KvresError

LLAMA_CPP_PYTHON = "0.3.36"
RAY_FLOOR = "2.60.0"


class EngineVersionError(KvresError, RuntimeError):
    """An engine library of a version kvres is not tested with; names both versions."""


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def check_llama_cpp_python(installed: str | None = None) -> None:
    found = installed if installed is not None else installed_version("llama-cpp-python")
    if found is None:
        raise EngineVersionError(
            f"llama-cpp-python is not installed: the llama engine needs llama-cpp-python=={LLAMA_CPP_PYTHON} "
            "(pip install 'kvres[llama]')")
    if found != LLAMA_CPP_PYTHON:
        raise EngineVersionError(
            f"llama-cpp-python {found} is installed, but kvres parses the KV state format of llama-cpp-python "
            f"{LLAMA_CPP_PYTHON} (kvres.actors.engines.llama.state_blob): install llama-cpp-python=="
            f"{LLAMA_CPP_PYTHON}")
