"""The HTTP front's metrics, per route, in Prometheus's text format.

Primitives:
- ``Histogram(buckets)``: ``observe(seconds)``, ``merge(counts, total, n)``, ``state()``.
- ``RequestSample``: what one request reports when it ends: route, status, time to first token,
  the gaps between its tokens (as a ``Histogram`` state), duration, token counts.
- ``ServeMetrics``: ``enter(replica, route)`` / ``leave(replica, route)`` (the queue depth: requests
  received and not yet answered, per route, summed over replicas), ``record(sample)``,
  ``session_counters(session_id)`` (a bound session's turns, prefilled / cached / completion
  tokens through HTTP: ``SESSION_COUNTERS``; those of the ``max_sessions`` sessions whose turns
  came last: sessions that expired are never told), ``forget_session(session_id)``,
  ``render() -> str`` (``text/plain; version=0.0.4``): ``kvres_serve_requests_total{route,status}``,
  ``kvres_serve_time_to_first_token_seconds``, ``kvres_serve_inter_token_latency_seconds``,
  ``kvres_serve_request_duration_seconds`` (histograms per route), ``kvres_serve_queue_depth{route}``,
  ``kvres_serve_tokens_total{route,kind}`` (kind: prompt, cached, completion),
  ``kvres_serve_prefix_breaks_total{route}`` (bound turns whose rendered conversation left what
  their session held: a client or template rewrote earlier turns).

- ``ServeMetrics.merge(replica, delta, in_flight)``: what a replica aggregated, added.
- ``ReplicaMetrics(send, flush_every_s=1.0)``: a replica's requests aggregated in its own process
  (``enter``, ``record``), sent in one call per flush (``flush``): when no request of the replica is
  left in flight, else at most every ``flush_every_s``; no Ray call per request.

One ``ServeMetrics`` lives in the serve state actor (``state_actor``), so ``/metrics`` answers the
same whichever replica serves it (a replica flushes its own before it reads them; another
replica's requests still in flight count within ``flush_every_s``).
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last: above every bound (+Inf only)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        if not math.isfinite(value) or value < 0:
            return
        i = next((i for i, b in enumerate(self.buckets) if value <= b), len(self.buckets))
        self.counts[i] += 1
        self.total += value
        self.n += 1

    def merge(self, counts: list[int], total: float, n: int) -> None:
        if len(counts) != len(self.counts):
            raise ValueError(f"histogram counts have {len(counts)} buckets, expected {len(self.counts)}")
        self.counts = [a + b for a, b in zip(self.counts, counts, strict=True)]
        self.total += total
        self.n += n

    def state(self) -> tuple[list[int], float, int]:
        return list(self.counts), self.total, self.n

    def lines(self, name: str, labels: str) -> list[str]:
        out, running = [], 0
        for bound, count in zip((*self.buckets, math.inf), self.counts, strict=True):
            running += count
            le = "+Inf" if bound == math.inf else f"{bound:g}"
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {running}')
        out.append(f"{name}_sum{{{labels}}} {self.total:.6f}")
        out.append(f"{name}_count{{{labels}}} {self.n}")
        return out


@dataclass
class RequestSample:
    route: str
    status: int
    duration_s: float
    ttft_s: float | None = None
    gaps: tuple[list[int], float, int] | None = None  # a TOKEN_GAP_BUCKETS histogram's state
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    session_id: str | None = None  # a session-bound turn: counted in that session's counters too
    prefix_breaks: int = 0  # 1: the turn's conversation left what its session held


SESSION_COUNTERS = ("turns", "prefilled_tokens", "cached_tokens", "completion_tokens")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass
class ServeMetrics:
    requests: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    ttft: dict[str, Histogram] = field(default_factory=dict)
    gaps: dict[str, Histogram] = field(default_factory=dict)
    duration: dict[str, Histogram] = field(default_factory=dict)
    tokens: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    in_flight: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    sessions: dict[str, dict[str, int]] = field(default_factory=dict)  # the last used last
    max_sessions: int = 100_000
    prefix_breaks: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def enter(self, replica: str, route: str) -> None:
        self.in_flight[(replica, route)] += 1

    def leave(self, replica: str, route: str) -> None:
        key = (replica, route)
        self.in_flight[key] = max(0, self.in_flight[key] - 1)

    def record(self, sample: RequestSample) -> None:
        route = sample.route
        self.requests[(route, sample.status)] += 1
        self.duration.setdefault(route, Histogram(LATENCY_BUCKETS)).observe(sample.duration_s)
        if sample.ttft_s is not None:
            self.ttft.setdefault(route, Histogram(LATENCY_BUCKETS)).observe(sample.ttft_s)
        if sample.gaps is not None and sample.gaps[2]:
            self.gaps.setdefault(route, Histogram(TOKEN_GAP_BUCKETS)).merge(*sample.gaps)
        for kind, n in (("prompt", sample.prompt_tokens), ("cached", sample.cached_tokens),
                        ("completion", sample.completion_tokens)):
            if n:
                self.tokens[(route, kind)] += n
        if sample.prefix_breaks:
            self.prefix_breaks[route] += sample.prefix_breaks
        if sample.session_id is not None and sample.status < 400:
            c = self._used(sample.session_id)
            c["turns"] += 1
            c["prefilled_tokens"] += sample.prompt_tokens - sample.cached_tokens
            c["cached_tokens"] += sample.cached_tokens
            c["completion_tokens"] += sample.completion_tokens

    def merge(self, replica: str, delta: ServeMetrics, in_flight: dict[str, int]) -> None:
        """Add what a replica aggregated since its last flush (``ReplicaMetrics``); ``in_flight``:
        its requests not yet answered now, per route."""
        for key, n in delta.requests.items():
            self.requests[key] += n
        for mine, theirs in ((self.ttft, delta.ttft), (self.gaps, delta.gaps), (self.duration, delta.duration)):
            for route, hist in theirs.items():
                mine.setdefault(route, Histogram(hist.buckets)).merge(*hist.state())
        for kind, n in delta.tokens.items():
            self.tokens[kind] += n
        for route, n in delta.prefix_breaks.items():
            self.prefix_breaks[route] += n
        for session_id, counters in delta.sessions.items():
            c = self._used(session_id)
            for name, n in counters.items():
                c[name] += n
        for route, n in in_flight.items():
            self.in_flight[(replica, route)] = n

    def _used(self, session_id: str) -> dict[str, int]:
        """The session's counters, moved to the end (used last); the least recently used past
        ``max_sessions`` are dropped."""
        c = self.sessions.pop(session_id, None) or dict.fromkeys(SESSION_COUNTERS, 0)
        self.sessions[session_id] = c
        while len(self.sessions) > self.max_sessions:
            del self.sessions[next(iter(self.sessions))]
        return c

    def session_counters(self, session_id: str) -> dict[str, int]:
        return dict(self.sessions.get(session_id) or dict.fromkeys(SESSION_COUNTERS, 0))

    def forget_session(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)

    def queue_depth(self) -> dict[str, int]:
        depth: dict[str, int] = defaultdict(int)
        for (_, route), n in self.in_flight.items():
            depth[route] += n
        return dict(depth)

    def render(self) -> str:
        lines = ["# HELP kvres_serve_requests_total HTTP requests answered, by route and status.",
                 "# TYPE kvres_serve_requests_total counter"]
        for (route, status), n in sorted(self.requests.items()):
            lines.append(f'kvres_serve_requests_total{{route="{_label(route)}",status="{status}"}} {n}')
        for name, what, table in (
            ("kvres_serve_time_to_first_token_seconds", "From the request to its first token.", self.ttft),
            ("kvres_serve_inter_token_latency_seconds", "Between two tokens of one stream.", self.gaps),
            ("kvres_serve_request_duration_seconds", "From the request to its last byte.", self.duration),
        ):
            lines += [f"# HELP {name} {what}", f"# TYPE {name} histogram"]
            for route, hist in sorted(table.items()):
                lines += hist.lines(name, f'route="{_label(route)}"')
        lines += ["# HELP kvres_serve_queue_depth Requests received and not yet answered, by route.",
                  "# TYPE kvres_serve_queue_depth gauge"]
        for route, n in sorted(self.queue_depth().items()):
            lines.append(f'kvres_serve_queue_depth{{route="{_label(route)}"}} {n}')
        lines += ["# HELP kvres_serve_tokens_total Tokens by route and kind (prompt: the context a turn "
                  "generated from; cached: the part of it the session already held; completion: generated).",
                  "# TYPE kvres_serve_tokens_total counter"]
        for (route, kind), n in sorted(self.tokens.items()):
            lines.append(f'kvres_serve_tokens_total{{route="{_label(route)}",kind="{kind}"}} {n}')
        lines += ["# HELP kvres_serve_prefix_breaks_total Bound turns whose rendered conversation left what their "
                  "session held (earlier turns rewritten: the rest prefilled again).",
                  "# TYPE kvres_serve_prefix_breaks_total counter"]
        for route, n in sorted(self.prefix_breaks.items()):
            lines.append(f'kvres_serve_prefix_breaks_total{{route="{_label(route)}"}} {n}')
        return "\n".join(lines) + "\n"


class ReplicaMetrics:
    """A replica's requests aggregated where they are made, sent to the shared ``ServeMetrics`` in
    one call per flush rather than calls per request: ``enter(route)`` / ``record(sample)`` touch
    only this process; ``send(delta, in_flight)`` (the serve state actor's ``merge``, not waited
    for) runs when the replica has no request left in flight (the end of a burst: its figures are
    there at once), else at most every ``flush_every_s`` (a background thread), and on ``flush()``
    (before the shared figures are read)."""

    def __init__(self, send: Callable[[ServeMetrics, dict[str, int]], None], flush_every_s: float = 1.0) -> None:
        self._send = send
        self.flush_every_s = flush_every_s
        self._lock = threading.Lock()
        self._pending = ServeMetrics()
        self._in_flight: dict[str, int] = defaultdict(int)
        self._dirty = False
        self._last = time.monotonic()
        self._flusher: threading.Thread | None = None

    def enter(self, route: str) -> None:
        with self._lock:
            self._in_flight[route] += 1
            self._dirty = True

    def record(self, sample: RequestSample) -> None:
        with self._lock:
            self._in_flight[sample.route] = max(0, self._in_flight[sample.route] - 1)
            self._pending.record(sample)
            self._dirty = True
            now_due = not any(self._in_flight.values()) or time.monotonic() - self._last >= self.flush_every_s
            if not now_due and (self._flusher is None or not self._flusher.is_alive()):
                self._flusher = threading.Thread(target=self._flush_later, name="kvres-serve-metrics", daemon=True)
                self._flusher.start()
        if now_due:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            if not self._dirty:
                return
            delta, self._pending = self._pending, ServeMetrics()
            in_flight = dict(self._in_flight)
            self._dirty, self._last = False, time.monotonic()
            self._send(delta, in_flight)  # under the lock: deltas reach the actor in the order taken

    def _flush_later(self) -> None:
        while True:
            time.sleep(self.flush_every_s)
            self.flush()
            with self._lock:
                if not any(self._in_flight.values()) and not self._dirty:
                    self._flusher = None
                    return
