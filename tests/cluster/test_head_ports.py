"""``kvres start`` chooses the head's ports so that it never takes one another process holds."""

from __future__ import annotations

import socket

import pytest

from kvres.cluster.head_ports import FIXED_DEFAULTS, PortTakenError, bindable, choose_head_ports


def _listening(host: str = "127.0.0.1") -> tuple[socket.socket, int]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((host, 0))
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


def test_a_default_held_on_another_address_of_the_machine_is_moved_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another Ray's dashboard agent listens on the node's address, not 127.0.0.1: a head started here
    with that port would fail to start its agent, and ``ray job submit`` would find none."""
    from kvres.cluster import head_ports

    holder, held = _listening("127.0.0.2")  # another address of this machine (loopback's whole /8)
    monkeypatch.setitem(head_ports.FIXED_DEFAULTS, "--dashboard-agent-listen-port", held)
    try:
        assert not bindable("127.0.0.1", held)
        ports = choose_head_ports("127.0.0.1")
        assert ports.moved["--dashboard-agent-listen-port"][0] == held
        assert ports.ports["--dashboard-agent-listen-port"] != held
    finally:
        holder.close()
