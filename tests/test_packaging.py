"""A normal (non-editable) install maps the four folders to kvres.* and works outside the repo."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from tests.conftest import REPO_ROOT


def test_wheel_install_imports_from_outside_the_repository(tmp_path) -> None:
    # build from a copy: setuptools leaves build/ in the source tree, and a stale one would leak in
    source = tmp_path / "src"
    shutil.copytree(REPO_ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", "results", "models", ".*_cache"))
    target = tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    code = (
        "import kvres.policy, kvres.coldstore, kvres.actors, kvres.cluster, kvres.actors.engines.llama\n"
        "import kvres.actors.engines.openvino, kvres.actors.tools.rendering\n"
        "print(kvres.policy.__file__)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith(str(target)), out.stdout


def test_rich_is_installed_with_kvres_so_top_redraws_in_place() -> None:
    import tomllib

    from kvres.cluster.top import _live_rich

    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.split(">")[0].split("=")[0].strip() == "rich" for d in declared), declared
    assert _live_rich() is not None  # kvres top takes the in-place path on a terminal
