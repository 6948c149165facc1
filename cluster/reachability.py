"""Whether a Ray cluster answers at an address, known in seconds (``ray.init`` retries for minutes).

Primitives:
- ``check_reachable(address)``: something accepts connections at HOST:PORT and speaks gRPC as a
  Ray GCS does, else ``ClusterUnreachableError`` naming the address and what was found there.
- ``split_address(address) -> (host, port)``, ``port_open(host, port)``; ``DEFAULT_PORT``.
- ``ClusterUnreachableError``.
"""

from __future__ import annotations

import socket

from kvres.policy import KvresError

DEFAULT_PORT = 6379


class ClusterUnreachableError(KvresError, ConnectionError):
    """No Ray cluster answers at the address given."""


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterUnreachableError(
            f"Ray address {address!r} is not HOST:PORT (for example 127.0.0.1:{DEFAULT_PORT})"
        )
    return host, int(port)


def port_open(host: str, port: int, timeout_s: float = 3.0) -> OSError | None:
    """None when something accepts connections at host:port, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return exc


def _answers_grpc(address: str, timeout_s: float = 5.0) -> bool:
    """Whether what listens there speaks gRPC, as a Ray GCS does (``ray.init`` on a port held by
    something else waits about a minute before it fails)."""
    import grpc

    channel = grpc.insecure_channel(address)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()


def check_reachable(address: str) -> None:
    """Raise ``ClusterUnreachableError`` unless a Ray GCS may answer at ``address`` (HOST:PORT)."""
    host, port = split_address(address)
    refused = port_open(host, port)
    if refused is not None:
        raise ClusterUnreachableError(
            f"no Ray cluster at {address}: nothing accepts connections on port {port} of {host} "
            f"({refused.strerror or refused}); start one with `kvres start --port {port}`"
        )
    if not _answers_grpc(address):
        raise ClusterUnreachableError(
            f"no Ray cluster at {address}: something listens on port {port} of {host} but does not "
            "answer as a Ray GCS"
        )
