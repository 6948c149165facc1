"""An analytic model of the planner protocol, fed with costs measured on this machine.

Primitives:
- ``Costs``: what one planner call costs (seconds, measured): a pushed report, a placement (a
  fixed part plus a part per backend in the view), a forget, an old-path plan, the round trip of
  a call, a backend's own opening, one backend's stats call in the old placement, a report's size;
  ``scaled(factor)`` (calibration against a simulation).
- ``Workload(backends, sessions, session_lifetime_s, reports_per_backend_s, plans_per_backend_s)``.
- ``planner_load(costs, w)``: arrival rates and the planner's utilisation, new protocol and old.
- ``open_latency_s(costs, w)``: open_session's latency, new protocol (one planner call, M/G/1
  queueing for the planner) and old (one stats call per backend).
- ``saturation_backends(costs, sessions_per_backend, ...)``: the backend count at which the planner
  is busy all the time, new protocol and old (every step's plan through the planner).

The planner is one single-threaded actor: an M/G/1 server whose jobs are the pushed reports, the
placements and the forgets (new protocol), plus one plan per backend step that needs room (old
protocol). Sessions open at ``sessions / session_lifetime_s`` per second and close as often.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class Costs:
    rtt_s: float  # a trivial planner call, round trip as a driver sees it
    report_s: float  # planner time per pushed report
    place_base_s: float  # planner time per placement: base + per_backend * backends in the view
    place_per_backend_s: float
    forget_s: float
    plan_s: float  # old path: one plan_backend through the planner
    open_backend_s: float  # the backend's opening, round trip
    stats_call_s: float  # old placement: added latency per backend asked for its stats
    report_bytes: int

    def place_s(self, backends: int) -> float:
        return self.place_base_s + self.place_per_backend_s * backends

    def scaled(self, factor: float) -> Costs:
        """Every planner-side cost times ``factor`` (round trips and backends' own costs as they are)."""
        return replace(self, report_s=self.report_s * factor, place_base_s=self.place_base_s * factor,
                       place_per_backend_s=self.place_per_backend_s * factor, forget_s=self.forget_s * factor,
                       plan_s=self.plan_s * factor)


@dataclass(frozen=True)
class Workload:
    backends: int
    sessions: int
    session_lifetime_s: float
    reports_per_backend_s: float
    plans_per_backend_s: float  # steps that need a plan, per backend and second

    @property
    def opens_per_s(self) -> float:
        return self.sessions / self.session_lifetime_s


def _jobs(costs: Costs, w: Workload, old: bool) -> list[tuple[float, float]]:
    """(arrivals per second, service seconds) of each kind of planner job."""
    jobs = [
        (w.backends * w.reports_per_backend_s, costs.report_s),
        (w.opens_per_s, costs.place_s(w.backends)),
        (w.opens_per_s, costs.forget_s),
    ]
    if old:
        jobs = [(2 * w.opens_per_s, costs.forget_s),  # register and forget, as trivial as a forget
                (w.backends * w.plans_per_backend_s, costs.plan_s)]
    return jobs


def planner_load(costs: Costs, w: Workload) -> dict[str, float]:
    new, old = _jobs(costs, w, False), _jobs(costs, w, True)
    return {
        "reports_per_s": w.backends * w.reports_per_backend_s,
        "report_bytes_per_s": w.backends * w.reports_per_backend_s * costs.report_bytes,
        "opens_per_s": w.opens_per_s,
        "utilisation": sum(rate * s for rate, s in new),
        "utilisation_old": sum(rate * s for rate, s in old),
        "plans_per_s_old": w.backends * w.plans_per_backend_s,
        "placements_per_s_capacity": 1.0 / costs.place_s(w.backends),
        "plans_per_s_capacity_old": 1.0 / costs.plan_s,
    }


def _wait_s(jobs: list[tuple[float, float]]) -> float:
    """Pollaczek-Khinchine: the mean wait of an M/G/1 queue with deterministic service per kind."""
    rho = sum(rate * s for rate, s in jobs)
    if rho >= 1:
        return math.inf
    return sum(rate * s * s for rate, s in jobs) / (2 * (1 - rho))


def open_latency_s(costs: Costs, w: Workload) -> dict[str, float]:
    new = costs.rtt_s + _wait_s(_jobs(costs, w, False)) + costs.place_s(w.backends) + costs.open_backend_s
    old = costs.rtt_s + costs.stats_call_s * w.backends + costs.open_backend_s
    return {"new": new, "old": old}


def saturation_backends(
    costs: Costs, sessions_per_backend: float, session_lifetime_s: float, reports_per_backend_s: float,
    plans_per_backend_s: float,
) -> dict[str, float]:
    """Backends at which the planner's utilisation reaches 1 (sessions grow with backends)."""
    opens = sessions_per_backend / session_lifetime_s  # per backend and second
    # new: B * (r * s_r + opens * (base + forget)) + B^2 * opens * per_backend = 1
    a = opens * costs.place_per_backend_s
    b = reports_per_backend_s * costs.report_s + opens * (costs.place_base_s + costs.forget_s)
    new = (-b + math.sqrt(b * b + 4 * a)) / (2 * a) if a > 0 else 1 / b
    old = 1.0 / (plans_per_backend_s * costs.plan_s + 2 * opens * costs.forget_s)
    return {"new": new, "old": old}


def as_dict(costs: Costs) -> dict[str, float]:
    return asdict(costs)
