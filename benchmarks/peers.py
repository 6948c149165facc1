"""llama-server, the peer a user would pick instead of kvres: the binary ``make peers`` caches, run.

Primitives:
- ``llama_server_path(root=ROOT) -> Path``: ``build/peers/llama-server-<pin>``, built by ``make peers``
  from the llama.cpp that the sdist of the pinned llama-cpp-python (``kvres.actors.pins``) vendors;
  ``PeerMissingError`` (saying to run ``make peers``) where it is not there.
- ``free_port() -> int``: a free TCP port of 127.0.0.1.
- ``LlamaServer(model, flags, binary=None, log_path=None)``: ``start()`` runs it on a free port of
  127.0.0.1 with ``flags`` (its command-line options beside ``-m``, ``--host``, ``--port``) and waits
  until ``/health`` answers ok (``PeerStartError`` with the end of its log when it exits or times
  out first); ``base_url``, ``pid``; ``stop()`` (SIGTERM, SIGKILL after 10 s); a context manager.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).resolve().parents[1]
PEERS_DIR = Path("build") / "peers"
HEALTH_TIMEOUT_S = 300.0


class PeerMissingError(RuntimeError):
    """The peer's binary is not built; says how to build it."""


class PeerStartError(RuntimeError):
    """The peer did not come up; quotes the end of its log."""


def llama_server_path(root: Path = ROOT) -> Path:
    from kvres.actors.pins import LLAMA_CPP_PYTHON

    path = root / PEERS_DIR / f"llama-server-{LLAMA_CPP_PYTHON}"
    if not path.is_file():
        raise PeerMissingError(
            f"{path} is not built: run `make peers` (llama-server from the llama.cpp that "
            f"llama-cpp-python=={LLAMA_CPP_PYTHON}'s sdist vendors; built once, then cached)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class LlamaServer:
    def __init__(self, model: str | os.PathLike[str], flags: list[str], binary: Path | None = None,
                 log_path: Path | None = None) -> None:
        self.model, self.flags = Path(model), list(flags)
        self.binary = binary or llama_server_path()
        self.log_path = log_path or Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("llama-server is not running")
        return self._process.pid

    def start(self, timeout_s: float = HEALTH_TIMEOUT_S) -> LlamaServer:
        import httpx

        self.port = free_port()
        command = [str(self.binary), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(self.port),
                   *self.flags]
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise PeerStartError(f"llama-server exited with {self._process.returncode} "
                                     f"({' '.join(command)}):\n{_tail(self.log_path)}")
            try:
                answer = httpx.get(f"{self.base_url}/health", timeout=5.0)
                if answer.status_code == 200 and answer.json().get("status") == "ok":
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise PeerStartError(f"llama-server not healthy after {timeout_s:.0f} s:\n{_tail(self.log_path)}")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
