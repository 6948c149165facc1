"""The docs run as written: every ```python, ```bash and ```console block of docs/*.md is run, in
the order of its document, as a newcomer pastes it on a fresh checkout (README.md's blocks run in
tests/docs/test_quickstart.py, on a fresh clone; every block of both must be marked).

How a block runs:
- ``python``: ``sys.executable`` (the venv's python) reads the block from stdin in the document's
  scratch checkout; a first-line comment shaped like its command line
  (``# RAY_ADDRESS=... KVRES_CONFIG=cluster.json python chat.py``) sets those variables.
- ``bash``: every command (a line, ``\\`` continuations joined) through bash; ``console``: the
  commands after a ``$ `` prompt, the other lines being their output. The shell blocks of one
  document share one shell state (what they ``export``): one terminal pasted into.
- ``text`` (output, diagrams, formulas), ``yaml`` and ``json`` (a file's contents): never run. A
  block marked otherwise fails the test.

What the test adds, and only this, so that it never attaches to another Ray cluster of this
machine and leaves nothing behind:
- each document runs in a scratch folder holding the checkout's top-level entries as symbolic
  links (files the docs write, such as ``cluster.json``, land there), with the venv first on PATH,
  ``RAY_TMPDIR`` (Ray's folder) and ``XDG_CACHE_HOME`` (kvres's caches and cold-store folders) of
  its own, ``RAY_AUTH_MODE=disabled`` (a throwaway cluster on 127.0.0.1), ``OMP_NUM_THREADS=1``,
  and no ``RAY_ADDRESS`` or ``KVRES_*`` from the caller;
- ``kvres start`` gets free ports, ``--node-ip-address 127.0.0.1`` and no Ray dashboard (its other
  arguments are the document's), and the documentation addresses ``192.0.2.2:6379`` and
  ``127.0.0.1:6379`` become the address that ``kvres start`` printed;
- afterwards a head ``kvres start`` started and the document left running gets ``kvres stop
  --ray`` (kvres's cold-store folders go with it), and every Ray process of the document's
  ``RAY_TMPDIR`` is killed (never a machine-wide ``ray stop``);
- ``make`` takes the install as done (``-o .venv/.kvres-installed``): the test never reinstalls
  the environment it runs in;
- a ``kvres serve`` that serves until Ctrl-C (no ``--detach``) runs in the background, on a free
  port (the docs' ``127.0.0.1:8000`` becomes it), while the document's later blocks talk to it;
  the test waits for its ``/health`` first and stops it (SIGTERM) when the document ends.

``EXCLUDED`` lists the commands that cannot run here, with why; an entry that matches nothing any
more fails the test, so the list stays short and true.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx
import pytest

from kvres.cluster.standing import head_processes, stop_head
from kvres.policy import KvresError
from tests.cluster.conftest import free_port
from tests.conftest import REPO_ROOT
from tests.docs.doc_blocks import RUN_SHELL, Block, Command, blocks, commands, python_env
from tests.examples.test_examples import _stop_ray_started_in

VENV_BIN = Path(sys.executable).parent
_KVRES_START = re.compile(r"^((?:[A-Za-z_]\w*=\S*\s+)*)kvres start\b")  # after any VAR=value
_MAKE = re.compile(r"^((?:[A-Za-z_]\w*=\S*\s+)*)make\b")
_KVRES_SERVE = re.compile(r"^(?:[A-Za-z_]\w*=\S*\s+)*(?:\.venv/bin/)?kvres serve\b(?!.*--detach)")
DOC_SERVE_ADDRESS = "127.0.0.1:8000"  # where the docs' clients find `kvres serve`
SERVE_START_TIMEOUT_S = 300
DOC_ADDRESS = "192.0.2.2:6379"  # the address the docs show (RFC 5737 documentation range)
DOC_LOCAL_ADDRESS = "127.0.0.1:6379"  # what `kvres start --node-ip-address 127.0.0.1` prints
DOCS = ["README.md", *sorted(p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "docs").glob("*.md"))]
# README.md runs whole in tests/docs/test_quickstart.py, on a fresh clone, every block as written (a
# stricter run of the same blocks); here the docs/ pages run.
RUN_DOCS = [doc for doc in DOCS if doc != "README.md"]
COMMAND_TIMEOUT_S = 300


@dataclass(frozen=True)
class Exclusion:
    doc: str
    command: str  # a shell command that starts with this, or a python block that holds it
    reason: str


EXCLUDED = (
    Exclusion("README.md", "make test", "runs the whole suite, this test included"),
    Exclusion("README.md", "RAY_AUTH_MODE=token ray job submit",
              "needs the Ray dashboard, which the heads this test starts run without; tests/docs/test_quickstart.py "
              "runs it as written"),
    Exclusion("docs/gpu.md", 'CMAKE_ARGS="-DGGML_CUDA=on"', "rebuilds llama-cpp-python from PyPI against CUDA"),
    Exclusion("docs/operators.md", "apt-get install prometheus", "installs a package from the internet"),
    Exclusion("docs/operators.md", "prometheus --config.file", "a server that runs until it is stopped"),
    Exclusion("docs/serving.md", "kvres serve --model ~/models/", "a GGUF the reader downloads (docs/models.md runs "
              "kvres serve --model on a family fixture)"),
    Exclusion("docs/serving.md", "kvres serve --config", "a second server beside the one the document runs"),
    Exclusion("docs/serving.md", "kvres start && kvres serve", "a third server, on a standing cluster"),
)


def _excluded(item: Block | Command) -> Exclusion | None:
    for rule in EXCLUDED:
        if rule.doc != item.doc:
            continue
        if isinstance(item, Command) and item.text.startswith(rule.command):
            return rule
        if isinstance(item, Block) and item.info == "python" and rule.command in item.text:
            return rule
    return None


def _doc_blocks(doc: str) -> list[Block]:
    return blocks(REPO_ROOT / doc, REPO_ROOT)


def _runnable(doc: str) -> Iterator[Block | Command]:
    """What a document runs, in order: python blocks whole, shell blocks command by command."""
    for block in _doc_blocks(doc):
        if block.info in RUN_SHELL:
            yield from commands(block)
        elif block.runs:
            yield block


def test_every_block_is_marked_and_every_exclusion_still_applies() -> None:
    items = [item for doc in DOCS for item in _runnable(doc)]  # an unmarked block raises here
    for rule in EXCLUDED:
        assert rule.doc in DOCS, f"excluded {rule.command!r} of {rule.doc}, which is not a checked doc"
        assert any(_excluded(item) is rule for item in items), (
            f"EXCLUDED lists {rule.command!r} in {rule.doc} ({rule.reason}), which no longer has it: "
            "drop the entry"
        )


class DocRun:
    """One document's scratch checkout, shell state and Ray folder."""

    def __init__(self, doc: str) -> None:
        self.doc = doc
        self.scratch = Path(tempfile.mkdtemp(prefix="kvdoc"))  # short: Ray's socket paths live under it
        self.workdir = self.scratch / "checkout"
        self.workdir.mkdir()
        for name in _checkout_entries():
            (self.workdir / name).symlink_to(REPO_ROOT / name)
        self.ray_tmp = self.scratch / "r"
        self.ray_tmp.mkdir()
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"  # until kvres start prints the one drivers use
        self.started_head = False
        self.base_env = _base_env(self.ray_tmp, self.scratch / "cache")
        self.state = self.scratch / "shell-state"
        subprocess.run(["bash", "-c", f"export -p > {self.state}"], env=self.base_env, check=True)
        self.serve_port = free_port()
        self.server: subprocess.Popen[str] | None = None
        self.server_output: list[str] = []

    def adapt(self, text: str) -> str:
        start = (f"kvres start --port {self.port} --node-ip-address 127.0.0.1 --num-cpus 2 "
                 "--ray-arg=--include-dashboard=false "
                 f"--ray-arg=--ray-client-server-port={free_port()} "
                 f"--ray-arg=--dashboard-agent-listen-port={free_port()}")
        text = _KVRES_START.sub(lambda m: m.group(1) + start, text)
        text = _MAKE.sub(lambda m: m.group(1) + "make -o .venv/.kvres-installed", text)
        if _KVRES_SERVE.match(text) and "--port" not in text:  # (before any comment that ends the line)
            text = text.replace("kvres serve", f"kvres serve --port {self.serve_port}", 1)
        return (text.replace(DOC_ADDRESS, self.address).replace(DOC_LOCAL_ADDRESS, self.address)
                .replace(DOC_SERVE_ADDRESS, f"127.0.0.1:{self.serve_port}"))

    def run_command(self, command: Command) -> None:
        text = self.adapt(command.text)
        if _KVRES_SERVE.match(command.text):
            self.start_server(command, text)
            return
        script = f"source {self.state}\n{text}\n__rc=$?\nexport -p > {self.state}\nexit $__rc\n"
        out = self._run(["bash", "-c", script], env=self.base_env, where=command, what=f"`{command.text}`")
        if _KVRES_START.match(command.text):
            self.started_head = True
            printed = re.search(rf"^kvres start: Ray head (?:started|already running) at (\S+:{self.port});",
                                out.stdout, re.M)
            assert printed, _failure(command, f"`{command.text}`", out, f"printed no address on port {self.port}")
            self.address = printed.group(1)

    def start_server(self, command: Command, text: str) -> None:
        """The command in the background, until it prints that it listens and ``/health`` answers."""
        assert self.server is None, f"{command.doc}:{command.line}: a second `kvres serve` in one document"
        script = f"source {self.state}\nexec {text}\n"
        self.server = subprocess.Popen(["bash", "-c", script], env=self.base_env, cwd=self.workdir, text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        listening = threading.Event()

        def read(stream: IO[str]) -> None:
            for line in stream:
                self.server_output.append(line)
                if line.startswith("kvres serve: listening on"):
                    listening.set()
            listening.set()

        assert self.server.stdout is not None
        threading.Thread(target=read, args=(self.server.stdout,), daemon=True).start()
        deadline = time.monotonic() + SERVE_START_TIMEOUT_S
        listening.wait(SERVE_START_TIMEOUT_S)
        while self.server.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.serve_port}/health", timeout=10).status_code == 200:
                    return
            time.sleep(0.5)
        pytest.fail(f"{command.doc}:{command.line}: `{command.text}` did not start serving within "
                    f"{SERVE_START_TIMEOUT_S} s\n{''.join(self.server_output)[-3000:]}", pytrace=False)

    def stop_server(self) -> None:
        if self.server is None or self.server.poll() is not None:
            return
        self.server.send_signal(signal.SIGTERM)
        try:
            self.server.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(self.server.pid, signal.SIGKILL)  # the group this test started, nothing else
            self.server.wait(timeout=30)

    def run_python(self, block: Block) -> None:
        env = {**self.base_env, **{k: self.adapt(v) for k, v in python_env(block).items()}}
        self._run([sys.executable, "-"], env=env, where=block, what="this python block",
                  stdin=self.adapt(block.text))

    def _run(self, argv: list[str], env: dict[str, str], where: Block | Command, what: str,
             stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        try:
            out = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env, cwd=self.workdir,
                                 timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"{where.doc}:{where.line}: {what} ran past {COMMAND_TIMEOUT_S} s\n"
                        f"{_tail(exc.stderr)}", pytrace=False)
        if out.returncode != 0:
            pytest.fail(_failure(where, what, out, f"exited {out.returncode}"), pytrace=False)
        return out

    def close(self) -> None:
        self.stop_server()
        if self.started_head and head_processes(self.port):  # the document left it running
            # kvres stop first: it removes the cold-store folders the namespace made in the user's cache
            subprocess.run([str(VENV_BIN / "kvres"), "stop", "--address", self.address, "--ray"], cwd=self.workdir,
                           env=self.base_env, capture_output=True, timeout=COMMAND_TIMEOUT_S)
            with contextlib.suppress(KvresError):
                stop_head(f"127.0.0.1:{self.port}")
        _stop_ray_started_in(str(self.ray_tmp))
        shutil.rmtree(self.scratch, ignore_errors=True)


def _checkout_entries() -> list[str]:
    """The checkout's top-level entries as a fresh clone has them (tracked or not ignored), and
    the venv ``make install`` made."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO_ROOT, capture_output=True,
                            text=True, check=True).stdout.split("\n")
    names = {line.split("/")[0] for line in listed if line}
    return sorted(n for n in names | {".venv"} if (REPO_ROOT / n).exists())


def _base_env(ray_tmp: Path, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k != "RAY_ADDRESS" and not k.startswith(("KVRES_", "PYTEST_", "VIRTUAL_ENV"))}
    env.update({
        "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", "VIRTUAL_ENV": str(VENV_BIN.parent),
        "RAY_TMPDIR": str(ray_tmp), "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1",
        "XDG_CACHE_HOME": str(cache),  # kvres's caches and cold-store folders: a fresh machine's, removed after
    })
    return env


def _tail(text: str | bytes | None, limit: int = 3000) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "")[-limit:]


def _failure(where: Block | Command, what: str, out: subprocess.CompletedProcess[str], how: str) -> str:
    stderr = out.stderr
    if isinstance(where, Block):  # a traceback's "<stdin>", line N is the document's line
        stderr = re.sub(r'File "<stdin>", line (\d+)',
                        lambda m: f'File "{where.doc}", line {where.line + int(m.group(1)) - 1}', stderr)
    return (f"{where.doc}:{where.line}: {what} {how}\n--- stderr ---\n{_tail(stderr)}\n"
            f"--- stdout ---\n{_tail(out.stdout, 1500)}")


@pytest.mark.slow
@pytest.mark.parametrize("doc", RUN_DOCS)
def test_doc_runs_as_written(doc: str) -> None:
    items = list(_runnable(doc))
    if not items:
        return
    run = DocRun(doc)
    try:
        for item in items:
            if _excluded(item) is not None:
                continue
            started = time.monotonic()
            if isinstance(item, Command):
                run.run_command(item)
            else:
                run.run_python(item)
            what = item.text.splitlines()[0] if isinstance(item, Command) else "python block"
            print(f"{item.doc}:{item.line}  {time.monotonic() - started:5.1f} s  {what[:80]}")  # shown with -s
    finally:
        run.close()
