"""Plain-text views of a kvres cluster for the command line: tables, sizes, a session's residency.

Primitives:
- ``format_table(headers, rows)``: columns padded to their widest cell; numbers right-aligned.
- ``human_bytes(n)``: ``0 B``, ``512 B``, ``12.5 KiB``, ``3.0 MiB``, ...
- ``policy_summary(policy, effective=None, degraded=None)``: one line for a
  ``SessionPolicy.model_dump()``; with ``degraded`` (``Session.stats()["degraded"]``) the effective
  policy that runs instead, what was asked and why.
- ``retention_summary(policy, pinned, tenant=None, paused=False)``: the owner's retention settings in words
  (priority, pin and whether it holds, idle and TTL limits, the pause for tools, the tenant's usage
  against its quota).
- ``residency_bar(ranges, token_count, width)``: the token log drawn as one line, ``#`` where the
  KV is resident, ``+`` where part of it is, ``.`` where none is.
- ``render_status(report, reprs=None)``: ``SessionManager.status()`` (or ``ClusterView.status()``)
  as tables: backends (live state: resident, peak, calls held; under the table, one line per
  backend that is down, starting or could not start, with its error), sessions, cold stores, and
  the actors' reprs (static facts: Ray records a repr once) when given.
- ``render_inspect(stats)``: one session's ``Session.stats()``: state, policy, retention, resident ranges over
  the token log, cold blocks per tier, counters.

Everything here is a pure function from plain data to text: no Ray, no colours, no carriage
returns, so the output reads the same in a terminal and in a log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvres.actors.config import SessionPolicy

BAR_WIDTH = 64
TIER_ORDER = {"ram": 0, "disk": 1}
LEGEND = "# resident   + partly resident   . not resident (parked in the cold store, or dropped)"


def human_bytes(n: float) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _is_number(cell: str) -> bool:
    return cell.replace(".", "", 1).replace("%", "").replace("/", "").strip().isdigit()


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    right = [all(_is_number(r[i]) for r in cells) and bool(cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        parts = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right, strict=True)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(list(headers)), line(["-" * w for w in widths]), *map(line, cells)])


def policy_summary(policy: Mapping[str, Any], effective: str | None = None, degraded: str | None = None) -> str:
    """The policy asked; where the backend degraded it, what runs instead and why."""
    asked = SessionPolicy.model_validate(dict(policy)).residency.describe()
    if not degraded:
        return asked
    return f"{effective} (degraded from: {asked}; because {degraded})"


def residency_bar(ranges: Sequence[Sequence[int]], token_count: int, width: int = BAR_WIDTH) -> str:
    if token_count <= 0:
        return ""
    width = max(1, min(width, token_count))
    out = []
    for i in range(width):
        lo, hi = i * token_count // width, (i + 1) * token_count // width
        covered = sum(max(0, min(hi, end) - max(lo, start)) for start, end in ranges)
        out.append("#" if covered >= hi - lo else "+" if covered else ".")
    return "".join(out)


def _short(node_id: object) -> str:
    return str(node_id or "")[:12]


def render_status(report: Mapping[str, Any], reprs: Mapping[str, str] | None = None) -> str:
    backends = list(report.get("backends", []))
    directory: Mapping[str, str] = report.get("sessions", {})
    parts = [f"kvres in namespace {report.get('namespace')!r}: {len(backends)} backend(s), "
             f"{len(directory)} session(s), {len(report.get('cold_stores', {}))} cold store(s)"]
    totals = report.get("load", {}).get("totals")
    if totals and totals.get("backends"):
        parts.append(f"planner's load view: {totals.get('resident_tokens')}/{totals.get('budget_tokens')} tokens "
                     f"resident, {totals.get('live_sessions')} live, {totals.get('suspended_sessions')} suspended, "
                     f"{totals.get('pending_sessions')} pending session(s)")
    parts.append("")

    rows = []
    for b in backends:
        sessions = b.get("sessions", {})
        live = sum(1 for s in sessions.values() if s.get("state") == "live")
        budget = int(b.get("kv_budget_tokens", 0))
        resident = int(b.get("resident_tokens", 0))
        share = f"{100 * resident / budget:.0f}%" if budget else "-"
        rows.append([b.get("backend"), b.get("engine", "-"), str(b.get("model", "-")).rsplit("/", 1)[-1],
                     live, len(sessions) - live, f"{resident}/{budget}", share, b.get("peak_resident_tokens", "-"),
                     b.get("calls_in_flight", "-"), _short(b.get("node_id"))])
    parts += ["BACKENDS", format_table(
        ["backend", "engine", "model", "live", "suspended", "resident/budget", "used", "peak", "calls", "node"],
        rows)]
    parts += [f"{b.get('backend')}: {b['error']}" for b in backends if b.get("error")] + [""]

    rows = []
    for b in backends:
        for sid, s in sorted(b.get("sessions", {}).items()):
            rows.append([sid, b.get("backend"), s.get("state"), s.get("resident_tokens", 0)])
    known = {r[0] for r in rows}
    rows += [[sid, backend, "?", "-"] for sid, backend in sorted(directory.items()) if sid not in known]
    parts += ["SESSIONS", format_table(["session", "backend", "state", "resident"], rows)
              if rows else "(none)", ""]

    rows = []
    for name, st in sorted(report.get("cold_stores", {}).items()):
        rows.append([name, human_bytes(st.get("ram_bytes", 0)), st.get("ram_blocks", 0),
                     human_bytes(st.get("ram_budget_bytes", 0)), human_bytes(st.get("disk_bytes", 0)),
                     st.get("disk_blocks", 0), human_bytes(st.get("disk_budget_bytes", 0))])
    parts += ["COLD STORES", format_table(
        ["store", "ram", "blocks", "ram budget", "disk", "blocks", "disk budget"], rows) if rows else "(none)"]
    if reprs:
        parts += ["", "ACTORS (their repr: static facts)", format_table(["actor", "repr"], sorted(reprs.items()))]
    return "\n".join(parts)


def retention_summary(policy: Mapping[str, Any], pinned: bool, tenant: Mapping[str, Any] | None = None,
                      paused: bool = False) -> str:
    """The owner's retention settings in words: priority, pin (and whether it holds), limits, the
    pause for tools (``paused``: it holds now), and the tenant's usage against its quota
    (``tenant``: ``Session.stats()["tenant"]``)."""
    parts = [f"priority {policy.get('priority', 0)}"]
    if policy.get("pin"):
        parts.append("pinned" if pinned else "pin asked, over the backend's max_pinned_tokens")
    if policy.get("idle_suspend_s") is not None:
        parts.append(f"parked after {policy['idle_suspend_s']:g} s idle")
    if policy.get("ttl_s") is not None:
        parts.append(f"closed after {policy['ttl_s']:g} s idle")
    pause = policy.get("tool_pause_s")
    if paused:
        parts.append(f"paused for tools now (up to {pause:g} s)" if pause is not None else "paused for tools now")
    elif pause is not None:
        parts.append(f"tool pauses up to {pause:g} s" if pause else "no tool pauses")
    if tenant:
        resident, cold = tenant.get("resident_quota"), tenant.get("cold_quota")
        parts.append(f"tenant {tenant.get('name')!r} holds {tenant.get('resident_tokens', 0)}"
                     + ("" if resident is None else f" of {resident}") + " resident tokens, "
                     + human_bytes(int(tenant.get("cold_bytes", 0)))
                     + ("" if cold is None else f" of {human_bytes(int(cold))}") + " cold")
    return ", ".join(parts)


def render_inspect(stats: Mapping[str, Any], width: int = BAR_WIDTH) -> str:
    count = int(stats.get("token_count", 0))
    ranges = [tuple(r) for r in stats.get("resident_ranges", [])]
    label = 11
    pad = " " * label
    lines = [
        f"session {stats.get('session_id')!r} on backend {stats.get('backend')!r}: {stats.get('state')}",
        "policy".ljust(label) + policy_summary(stats.get("policy", {}), stats.get("effective_policy"),
                                               stats.get("degraded")),
        "retention".ljust(label) + retention_summary(stats.get("policy", {}), bool(stats.get("pinned")),
                                                     stats.get("tenant"), bool(stats.get("paused_for_tools"))),
        "tokens".ljust(label) + f"{count} in the log, {stats.get('resident_tokens', 0)} resident",
        "resident".ljust(label) + (" ".join(f"[{a}, {b})" for a, b in ranges) or "none"),
    ]
    bar = residency_bar(ranges, count, width)
    if bar:
        lines += [pad + "|" + bar + "|", pad + "0".ljust(len(bar) + 1) + str(count), pad + LEGEND]
    cold = stats.get("cold", {})
    if cold:
        table = format_table(["tier", "blocks", "bytes"], [
            [tier, v.get("blocks", 0), human_bytes(v.get("bytes", 0))]
            for tier, v in sorted(cold.items(), key=lambda kv: (TIER_ORDER.get(kv[0], len(TIER_ORDER)), kv[0]))])
        tlines = table.splitlines()
        lines += ["cold".ljust(label) + tlines[0], *(pad + t for t in tlines[1:])]
    else:
        lines.append("cold".ljust(label) + "no blocks parked")
    counters = stats.get("counters", {})
    lines.append("counters".ljust(label) + "  ".join(f"{k} {v}" for k, v in counters.items()))
    return "\n".join(lines)
