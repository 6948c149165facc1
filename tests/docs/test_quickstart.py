"""The README's quick start as a user runs it: a fresh clone, then every command and python block of
README.md as written, in order (``make demo``, ``. .venv/bin/activate``, ``kvres serve --model
models/chat.gguf``, the ``openai`` snippet, the drivers, ``kvres start``, ``ray job submit``, ``kvres
stop --ray``), on the ports the README names.

What the test adds to a user's fresh clone, and only this:
- the clone is of this checkout (``git clone``: what is committed), in a temporary folder, with
  ``../shared`` beside it a symbolic link to this checkout's, and ``.venv`` a symbolic link to this
  checkout's venv (installing takes minutes): its ``pyproject.toml`` is dated before the venv's
  install stamp, so ``make demo`` finds the install done, as it would on a second run;
- ``PATH`` without any venv (the README's activation is what puts ``kvres`` on it), no
  ``RAY_ADDRESS`` or ``KVRES_*``, and ``RAY_TMPDIR`` / ``XDG_CACHE_HOME`` of its own, so that what it
  started is found and stopped afterwards (``kvres serve`` with SIGTERM, a head the README left
  running with ``kvres stop --ray``, then every process of its Ray folder);
- a ``kvres serve`` that serves until Ctrl-C runs in the background while the later blocks talk to
  it, as in a second terminal;
- ``ray job submit`` is tried again, 5 s apart, while Ray answers that the head's job agent is not
  up yet (the README says to); its job must print its result.

The README's chat must answer right: the replies the ``openai`` snippet prints are the ones its
``text`` block shows.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.docs.doc_blocks import Block, Command
from tests.docs.test_docs_run import COMMAND_TIMEOUT_S, DocRun, _failure, _runnable

README = "README.md"
README_SERVE_PORT = 8000
README_HEAD_PORT = 6379
STAMP = REPO_ROOT / ".venv" / ".kvres-installed"
NO_AGENT_YET = "No available agent to submit job"  # what `ray job submit` says while the head's agent starts
JOB_AGENT_TRIES = 36


def _user_env(ray_tmp: Path, cache: Path) -> dict[str, str]:
    venvs = {str(REPO_ROOT / ".venv" / "bin"), os.environ.get("VIRTUAL_ENV", "") + "/bin"}
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p not in venvs]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "VIRTUAL_ENV", "RAY_AUTH_MODE") and not k.startswith(("KVRES_", "PYTEST_"))}
    env.update({"PATH": os.pathsep.join(path), "RAY_TMPDIR": str(ray_tmp), "XDG_CACHE_HOME": str(cache),
                "OMP_NUM_THREADS": "1"})
    return env


class QuickStart(DocRun):
    """The README run in a fresh clone, its commands as written."""

    def __init__(self) -> None:
        self.doc = README
        self.scratch = Path(tempfile.mkdtemp(prefix="kvqs"))  # short: Ray's socket paths live under it
        self.workdir = self.scratch / "kvres"
        subprocess.run(["git", "clone", "--quiet", str(REPO_ROOT), str(self.workdir)], check=True, timeout=300)
        (self.scratch / "shared").symlink_to((REPO_ROOT.parent / "shared").resolve())
        (self.workdir / ".venv").symlink_to(REPO_ROOT / ".venv")
        stamp = STAMP.stat().st_mtime
        os.utime(self.workdir / "pyproject.toml", (stamp - 60, stamp - 60))  # installed after it: make skips it
        self.ray_tmp = self.scratch / "r"
        self.ray_tmp.mkdir()
        self.port = README_HEAD_PORT
        self.address = f"127.0.0.1:{self.port}"
        self.started_head = False
        self.base_env = _user_env(self.ray_tmp, self.scratch / "cache")
        self.state = self.scratch / "shell-state"
        subprocess.run(["bash", "-c", f"export -p > {self.state}"], env=self.base_env, check=True)
        self.serve_port = README_SERVE_PORT
        self.server = None
        self.server_output = []
        self.outputs: list[str] = []

    def adapt(self, text: str) -> str:
        return text  # as written

    def run_command(self, command: Command) -> None:
        if "ray job submit" not in command.text:
            super().run_command(command)
            return
        for _ in range(JOB_AGENT_TRIES):  # as the README says: the head's job agent may still be starting
            script = f"source {self.state}\n{command.text}\n"
            out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=self.base_env,
                                 cwd=self.workdir, timeout=COMMAND_TIMEOUT_S)
            if NO_AGENT_YET not in out.stderr:
                break
            time.sleep(5)
        assert out.returncode == 0, _failure(command, f"`{command.text}`", out, f"exited {out.returncode}")
        assert "KVRES_JOB_RESULT " in out.stdout, _failure(command, f"`{command.text}`", out, "printed no result")

    def run_python(self, block: Block) -> None:
        out = self._run(["bash", "-c", f"source {self.state}\nexec python -"], env=self.base_env, where=block,
                        what="this python block", stdin=block.text)
        self.outputs.append(out.stdout)


def _shown_after(block_text: str) -> str | None:
    """The ``text`` block that follows a python block in the README: what it prints."""
    text = (REPO_ROOT / README).read_text()
    at = text.index(block_text)
    follows = re.match(r"```\s*\n+```text\n(.*?)```", text[at + len(block_text):], re.S)
    return follows.group(1) if follows else None


@pytest.mark.slow
def test_the_readme_quick_start_runs_as_written_on_a_fresh_clone() -> None:
    if not STAMP.exists():
        pytest.fail(f"{STAMP} is missing: run `make install` first", pytrace=False)
    items = list(_runnable(README))
    assert any(isinstance(i, Block) and "X-Session-Id" in i.text for i in items), "the README lost its openai snippet"
    run = QuickStart()
    try:
        for item in items:
            if isinstance(item, Block):
                run.run_python(item)
                shown = _shown_after(item.text)
                if shown is not None:  # the chat answers as the README says (the model's replies, greedy)
                    assert shown in run.outputs[-1], (
                        f"README.md:{item.line}: the block printed\n{run.outputs[-1]}\nnot what the README shows:\n"
                        f"{shown}")
            elif item.text.startswith("make test"):
                continue  # the whole suite, this test included
            else:
                run.run_command(item)
    finally:
        run.close()
