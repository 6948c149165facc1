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


def test_a_gcs_port_held_without_answering_is_refused_before_ray_starts() -> None:
    """A port bound by another process (an outgoing connection's, a server not listening yet) answers
    no connection, so it looked free; Ray's GCS would fail to bind it after tens of seconds."""
    from kvres.cluster.standing import start_standing

    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("0.0.0.0", 0))  # noqa: S104 (a holder on every address, as an outgoing connection's port)
    held = int(holder.getsockname()[1])
    try:
        with pytest.raises(PortTakenError, match=f"--port {held}: another process holds"):
            start_standing(port=held, num_cpus=1)
    finally:
        holder.close()


def test_an_uncreatable_gcs_storage_folder_is_refused_by_name(tmp_path) -> None:
    from kvres.cluster.standing import gcs_env
    from kvres.policy import KvresError

    (tmp_path / "a-file").write_text("")
    with pytest.raises(KvresError, match="--gcs-storage .*a-file/tables: cannot create that folder"):
        gcs_env(gcs_storage_path=str(tmp_path / "a-file" / "tables"))


def test_a_head_that_failed_to_start_says_why_from_the_gcs_log(tmp_path) -> None:
    from kvres.cluster.standing import _gcs_log_tail

    logs = tmp_path / "logs"
    logs.mkdir()
    failed = ("[2026-12-06 00:02:55,164 C 12064 12064] (gcs_server) grpc_server.cc:134: Check failed: server_ "
              "Failed to start the grpc server. The specified port is 41999.")
    (logs / "gcs_server.err").write_text(f"*** SIGABRT received ***\n{failed}\n    @ 0x5616 main\n")
    (logs / "gcs_server.out").write_text(f"[2026-12-06 00:02:55,100 I 12064 12064] starting\n{failed}\n")
    said = f"Failed to start GCS. Please check {logs}/gcs_server.out for details. Last connection error: None"
    assert _gcs_log_tail(said) == f" | gcs_server: {failed}"  # the error line, once, without the stack
    assert _gcs_log_tail("exit 1 with nothing named") == ""


def test_a_port_whose_old_connections_wait_out_time_wait_is_free_for_a_head() -> None:
    """A head stopped (or killed) and started again on its port: its connections on that port stay
    in TIME_WAIT for a minute, which Ray's GCS binds over (its gRPC server sets SO_REUSEADDR, on the
    old sockets and the new one alike), so kvres start must too."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = int(listener.getsockname()[1])
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    accepted.close()  # the port's side closes first: its end of the connection waits in TIME_WAIT
    client.close()
    listener.close()
    assert not bindable("127.0.0.1", port)  # a plain bind is refused while TIME_WAIT lasts
    assert bindable("127.0.0.1", port, reuse_address=True)
