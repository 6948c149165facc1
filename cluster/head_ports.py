"""The ports a Ray head started by ``kvres start`` listens on, chosen so that it never collides with
another Ray on the same machine.

Primitives:
- ``FIXED_DEFAULTS``: the head's ports whose default is a fixed number (``ray start`` flag ->
  default): the dashboard (8265), the dashboard agent's HTTP port (52365, where ``ray job submit``
  lands), the Ray client server (10001). A second head on the machine would take the same ones.
- ``EPHEMERAL``: the head's other listening ports, random by default; named explicitly too, so
  that the printed line says every port the head holds.
- ``bindable(host, port, reuse_address=False) -> bool``: nothing on this machine listens on
  ``port``, of ``host`` or of any other address (a bind to ``host`` and one to every address
  succeed): Ray's agents listen on the node's address, which need not be ``host``;
  ``reuse_address``: bound as Ray's GCS binds (``SO_REUSEADDR``: a stopped head's connections
  still in TIME_WAIT leave the port free, a socket bound there does not).
- ``choose_head_ports(host, dashboard_port=None, taken=()) -> HeadPorts``: each fixed default where
  it is free, else a free port of the system's choice; an explicit ``dashboard_port`` is used as
  given (``PortTakenError`` naming it when something listens there).
- ``HeadPorts``: ``flags()`` (the ``ray start`` arguments), ``moved`` (the defaults another
  process holds, with the port chosen instead), ``summary()`` (one line for ``kvres start``).
- ``PortTakenError``: a typed ``KvresError`` / ``OSError``.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvres.policy.errors import KvresError

FIXED_DEFAULTS = {"--dashboard-port": 8265, "--dashboard-agent-listen-port": 52365, "--ray-client-server-port": 10001}
EPHEMERAL = ("--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port")


class PortTakenError(KvresError, OSError):
    """A port asked for explicitly is already in use on this machine."""


def bindable(host: str, port: int, reuse_address: bool = False) -> bool:
    for address in (host, ""):  # "": every address, so a holder of the port on another one counts
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            if reuse_address:  # as Ray's GCS binds: connections of a stopped head in TIME_WAIT do not count
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((address, port))
            except OSError:
                return False
    return True


def _free_port(host: str, avoid: set[int]) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in avoid:
            return port


@dataclass(frozen=True)
class HeadPorts:
    ports: dict[str, int]
    moved: dict[str, tuple[int, int]] = field(default_factory=dict)  # flag -> (default, chosen)

    def flags(self) -> list[str]:
        return [f"{flag}={port}" for flag, port in self.ports.items()]

    @property
    def dashboard_port(self) -> int:
        return self.ports["--dashboard-port"]

    def summary(self) -> str:
        held = ", ".join(f"{flag.removeprefix('--').removesuffix('-port')} {port}" for flag, port in self.ports.items())
        if not self.moved:
            return f"ports: {held}"
        taken = ", ".join(f"{default} ({flag.removeprefix('--')})" for flag, (default, _) in self.moved.items())
        return f"ports: {held}; another process (another Ray?) holds {taken}, so free ports were chosen"


def choose_head_ports(host: str, dashboard_port: int | None = None, taken: Iterable[int] = ()) -> HeadPorts:
    """``taken``: ports already promised (the GCS port) that no choice may reuse."""
    avoid = set(taken)
    ports: dict[str, int] = {}
    moved: dict[str, tuple[int, int]] = {}
    for flag, default in FIXED_DEFAULTS.items():
        if flag == "--dashboard-port" and dashboard_port is not None:
            if dashboard_port in avoid or not bindable(host, dashboard_port):
                raise PortTakenError(f"--dashboard-port {dashboard_port} is in use on {host}; choose another "
                                     "or leave it out (kvres start then picks a free one)")
            port = dashboard_port
        elif default not in avoid and bindable(host, default):
            port = default
        else:
            port = _free_port(host, avoid)
            moved[flag] = (default, port)
        ports[flag] = port
        avoid.add(port)
    for flag in EPHEMERAL:
        port = _free_port(host, avoid)
        ports[flag] = port
        avoid.add(port)
    return HeadPorts(ports, moved)
