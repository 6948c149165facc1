"""An address where no Ray cluster listens is named at once, by every command and by connect():
no minutes of GCS retries (``ray.init`` gives up after about a minute)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvres.cluster.reachability import ClusterUnreachableError, check_reachable
from tests.cluster.conftest import free_port

BIN = Path(sys.executable).parent


@pytest.mark.parametrize("command", [["status"], ["inspect", "some-session"], ["status", "--json"]])
def test_commands_name_an_address_where_nothing_listens(command: list[str]) -> None:
    port = free_port()
    out = subprocess.run([str(BIN / "kvres"), *command, "--address", f"127.0.0.1:{port}"],
                         capture_output=True, text=True, timeout=60, env={"PATH": str(BIN)})
    assert out.returncode != 0
    assert f"no Ray cluster at 127.0.0.1:{port}: nothing accepts connections" in out.stderr
    assert "GCS" not in out.stderr and "Traceback" not in out.stderr  # no raw retries


def test_connect_names_an_address_where_nothing_listens() -> None:
    port = free_port()
    code = ("from kvres.cluster import connect\n"
            f"connect(address='127.0.0.1:{port}')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "ClusterUnreachableError" in out.stderr
    assert f"no Ray cluster at 127.0.0.1:{port}" in out.stderr


def test_a_malformed_address_is_named() -> None:
    with pytest.raises(ClusterUnreachableError, match="is not HOST:PORT"):
        check_reachable("localhost")


def test_kvres_start_warns_when_the_ray_token_file_is_readable_by_others(tmp_path, monkeypatch) -> None:
    from kvres.cluster.standing import StandingCluster

    token = tmp_path / "auth_token"
    token.write_text("secret")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    cluster = StandingCluster("127.0.0.1:6379", "kvres", True, True, ["b0"], None, True)
    token.chmod(0o644)
    assert f"warning: Ray's token file {token} is readable by other users" in cluster.instructions()
    token.chmod(0o600)
    assert "warning" not in cluster.instructions()
