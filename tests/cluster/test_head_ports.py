"""``kvres start`` chooses the head's ports so that it never takes one another process holds."""

from __future__ import annotations

import socket

import pytest

from kvres.cluster.head_ports import FIXED_DEFAULTS, PortTakenError, bindable, choose_head_ports


def _listening() -> tuple[socket.socket, int]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, int(s.getsockname()[1])


def test_every_port_is_free_distinct_and_named() -> None:
    ports = choose_head_ports("127.0.0.1", taken=[6379])
    chosen = list(ports.ports.values())
    assert len(set(chosen)) == len(chosen) and 6379 not in chosen
    assert all(bindable("127.0.0.1", p) for p in chosen)
    assert set(FIXED_DEFAULTS) <= set(ports.ports)
    assert all(f"{flag}={port}" in ports.flags() for flag, port in ports.ports.items())


def test_a_default_someone_holds_is_moved_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvres.cluster import head_ports

    holder, held = _listening()  # stands for another Ray's dashboard agent on its default port
    monkeypatch.setitem(head_ports.FIXED_DEFAULTS, "--dashboard-agent-listen-port", held)
    try:
        ports = choose_head_ports("127.0.0.1")
        default, chosen = ports.moved["--dashboard-agent-listen-port"]
        assert default == held and chosen != held and ports.ports["--dashboard-agent-listen-port"] == chosen
        assert str(held) in ports.summary() and "another process" in ports.summary()
    finally:
        holder.close()


def test_an_explicit_dashboard_port_in_use_is_refused_by_name() -> None:
    holder, port = _listening()
    try:
        with pytest.raises(PortTakenError, match=f"--dashboard-port {port}"):
            choose_head_ports("127.0.0.1", dashboard_port=port)
    finally:
        holder.close()
