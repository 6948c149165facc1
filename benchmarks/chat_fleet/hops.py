"""A bound turn through ``kvres serve``, hop by hop: where its time and its CPU go.

Primitives:
- ``HOPS``: the hops a bound turn crosses, each with the process labels (``proc_cpu.label``) it
  runs in: the HTTP proxy, the Serve replica (or the direct front, which is both), the serve state actor (leases, metrics), the planner
  (the session directory), the backend (the Ray shell, the host and the engine), the cold store,
  and Ray's own processes (raylet, GCS, Serve controller, agents).
- ``serve_histogram(text, metric, route) -> (sum_s, count)``: one route's histogram of the
  front's ``/metrics`` text.
- ``hop_profile(run, metrics_before, metrics_after) -> dict``: for one kvres run of the driver
  (``run_side``): CPU ms per turn of each hop (from its ``cpu_by_process``), and the time a turn
  spends in the front as the replica measured it against what the client measured (the mean time
  to first token and turn duration: client, replica, and the difference, which is the HTTP proxy,
  the client's own HTTP and the hop between them).
- ``hop_table(profile) -> str``: the profile as a Markdown table (docs/serving.md).
"""

from __future__ import annotations

import re
from typing import Any

ROUTE = "/v1/chat/completions"
HOPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("HTTP proxy", ("ray::ProxyActor",)),
    ("Serve replica", ("ray::ServeReplica",)),
    ("direct front (--front direct)", ("ray::FrontServer",)),
    ("serve state actor", ("ray::ServeStateActor",)),
    ("planner", ("ray::PlannerServer",)),
    ("backend (shell, host, engine)", ("ray::BackendServer",)),
    ("cold store", ("ray::MeteredColdStoreServer", "ray::ColdStoreServer")),
    ("raylet", ("raylet",)),
    ("GCS", ("gcs_server",)),
    ("Serve controller", ("ray::ServeController",)),
)
OTHER = "other (agents, monitors, the CLI)"


def _hop_of(label: str) -> str:
    for hop, prefixes in HOPS:
        if any(label.startswith(p) for p in prefixes):
            return hop
    return OTHER


def serve_histogram(text: str, metric: str, route: str = ROUTE) -> tuple[float, int]:
    """(sum of seconds, count) of ``metric``'s histogram for ``route`` in a ``/metrics`` text."""
    found: dict[str, float] = {}
    for part in ("sum", "count"):
        pattern = rf'^{re.escape(metric)}_{part}\{{route="{re.escape(route)}"\}} (\S+)$'
        match = re.search(pattern, text, re.MULTILINE)
        found[part] = float(match.group(1)) if match else 0.0
    return found["sum"], int(found["count"])


def _mean_between(before: str, after: str, metric: str) -> float | None:
    s0, n0 = serve_histogram(before, metric)
    s1, n1 = serve_histogram(after, metric)
    return (s1 - s0) / (n1 - n0) if n1 > n0 else None


def hop_profile(run: dict[str, Any], metrics_before: str, metrics_after: str) -> dict[str, Any]:
    cpu: dict[str, float] = {}
    for label, row in run["cpu_by_process"].items():
        hop = _hop_of(label)
        cpu[hop] = cpu.get(hop, 0.0) + row["cpu_s_per_turn"] * 1e3
    ttft, latency = run["ttft_samples_s"], run["latency_samples_s"]
    client_ttft = sum(ttft) / len(ttft) if ttft else None
    client_turn = sum(latency) / len(latency) if latency else None
    replica_ttft = _mean_between(metrics_before, metrics_after, "kvres_serve_time_to_first_token_seconds")
    replica_turn = _mean_between(metrics_before, metrics_after, "kvres_serve_request_duration_seconds")

    def ms(x: float | None) -> float | None:
        return None if x is None else x * 1e3

    def gap(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else (a - b) * 1e3

    return {
        "cpu_ms_per_turn": {hop: cpu.get(hop, 0.0) for hop, _ in (*HOPS, (OTHER, ()))},
        "cpu_ms_per_turn_total": sum(cpu.values()),
        "time_ms": {
            "client_ttft_mean": ms(client_ttft), "replica_ttft_mean": ms(replica_ttft),
            "before_replica_ttft_mean": gap(client_ttft, replica_ttft),
            "client_turn_mean": ms(client_turn), "replica_turn_mean": ms(replica_turn),
            "outside_replica_turn_mean": gap(client_turn, replica_turn),
        },
    }


def hop_table(profile: dict[str, Any]) -> str:
    def cell(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}"

    lines = ["| hop | CPU ms per turn |", "|---|---|"]
    lines += [f"| {hop} | {cell(ms)} |" for hop, ms in profile["cpu_ms_per_turn"].items()]
    lines.append(f"| all of kvres serve | {cell(profile['cpu_ms_per_turn_total'])} |")
    t = profile["time_ms"]
    lines += ["", "| time (mean ms) | first token | whole turn |", "|---|---|---|",
              f"| the client | {cell(t['client_ttft_mean'])} | {cell(t['client_turn_mean'])} |",
              f"| the replica (from its handler's start) | {cell(t['replica_ttft_mean'])} | "
              f"{cell(t['replica_turn_mean'])} |",
              f"| outside the replica (client's HTTP, proxy) | {cell(t['before_replica_ttft_mean'])} | "
              f"{cell(t['outside_replica_turn_mean'])} |"]
    return "\n".join(lines)
