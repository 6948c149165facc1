"""Prometheus against a live kvres cluster: every kvres metric is exported (``required_metrics()``: every
counter, the request histograms, queue depth, the cold stores' losses, and every metric the Grafana
dashboard reads), every panel's query answers, and the numbers match what ``Session.stats()``, the
backends and the cold stores say and how many calls the traffic made.

Run: ``make prometheus-check`` (or ``.venv/bin/python scripts/prometheus_check.py``). Installs
Debian's ``prometheus`` with apt-get when it is missing (where that is impossible, or with
``--scrape-only``, it reads the metrics endpoint's text itself as Prometheus would scrape it,
``metrics_text``, checks every metric and value the same way, and panel queries for their series
only, and says so in its report), starts a local kvres cluster on the passkey
model with traffic (``live_cluster.drive``), scrapes its metrics endpoint every second, then asks
Prometheus over its HTTP API. The cluster opts in to per-session series
(``KVRES_METRICS_PER_SESSION=1`` in this driver, the cluster's first process) so the per-session
panel has data too. Writes ``docs/prometheus_check.json`` and ``docs/prometheus_check.md``; exits 1
when a check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from live_cluster import REPO, drive, ensure_binary, free_port, start_cluster

WAIT_S = 90
HISTOGRAMS = ("time_to_first_token_seconds", "inter_token_seconds", "call_seconds", "plan_latency_ms")


def required_metrics() -> list[str]:
    """Every series name kvres exports, as Prometheus names them (histograms by their _bucket)."""
    from kvres.actors.metrics import COUNTERS
    from kvres.cluster.grafana_dashboard import dashboard_metrics

    names = {f"ray_kvres_{c}_total" for c in COUNTERS} | {f"ray_kvres_{h}_bucket" for h in HISTOGRAMS}
    names |= {"ray_kvres_queue_depth", "ray_kvres_store_blocks_lost", "ray_kvres_tokens_total",
              "ray_kvres_resident_tokens", "ray_kvres_backend_resident_tokens", "ray_kvres_cold_bytes",
              "ray_kvres_cold_blocks"}
    return sorted(names | dashboard_metrics())


def _query(base: str, expr: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {expr!r}: {body}")
    return list(body["data"]["result"])


def _scalar(base: str, expr: str) -> float | None:
    result = _query(base, expr)
    return float(result[0]["value"][1]) if result else None


def _wait_scraping(base: str) -> None:
    deadline = time.time() + WAIT_S
    while time.time() < deadline:
        try:
            if _scalar(base, 'sum(up{job="ray"})') == 1 and _scalar(base, "count(ray_kvres_queue_depth)"):
                return
        except OSError:  # not listening yet
            pass
        time.sleep(0.5)
    raise SystemExit(f"Prometheus at {base} has not scraped the cluster's metrics within {WAIT_S} s")


def _let_scrape(base: str) -> None:
    """Until Prometheus holds the first calls' series, then two scrapes more: what follows is a rate."""
    deadline = time.time() + WAIT_S
    while time.time() < deadline and not _scalar(base, "sum(ray_kvres_inter_token_seconds_count)"):
        time.sleep(0.5)
    time.sleep(2.5)


def _start_prometheus(binary: str, target: str, folder: Path, port: int) -> subprocess.Popen[bytes]:
    config = folder / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n- job_name: ray\n  static_configs:\n"
        f"  - targets: ['{target}']\n"
    )
    log = (folder / "prometheus.log").open("wb")
    return subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )


def _expected(manager: Any, traffic: dict[str, Any]) -> list[tuple[str, str, float]]:
    """(what, PromQL, value kvres itself reports) for every number the dashboard shows."""
    import ray

    from kvres.actors.metrics import COUNTERS, STORE_EVENTS, session_label

    checks: list[tuple[str, str, float]] = []
    per_backend: dict[str, dict[str, int]] = {}
    for session in traffic["sessions"]:
        stats = session.stats()
        sid = session.session_id
        label = session_label(sid)  # the hashed label the metrics carry
        # a suspended or closed session's series ages out: no series reads as 0
        checks.append((f"resident tokens of {sid} ({stats['state']})",
                       f'sum(ray_kvres_resident_tokens{{session="{label}"}}) or vector(0)', stats["resident_tokens"]))
        totals = per_backend.setdefault(stats["backend"], {})
        for name in COUNTERS:
            totals[name] = totals.get(name, 0) + stats["counters"].get(name, 0)
            if stats["counters"].get(name):
                checks.append((f"{name} of {sid}", f'sum(ray_kvres_{name}_total{{session="{label}"}})',
                               stats["counters"][name]))
    for backend in manager.status()["backends"]:
        name = backend["backend"]
        checks.append((f"resident tokens of backend {name}",
                       f'sum(ray_kvres_backend_resident_tokens{{backend="{name}"}})', backend["resident_tokens"]))
        checks.append((f"queue depth of backend {name} at rest", f'sum(ray_kvres_queue_depth{{backend="{name}"}})', 0))
        for counter, total in sorted(per_backend.get(name, {}).items()):
            checks.append((f"{counter} of backend {name}",
                           f'sum(ray_kvres_{counter}_total{{backend="{name}"}}) or vector(0)', total))
    stores = ray.get([s.stats.remote() for s in manager.cold_stores.values()])
    for tier in ("ram", "disk"):
        checks.append((f"cold bytes, {tier} tier", f'sum(ray_kvres_cold_bytes{{tier="{tier}"}})',
                       sum(s[f"{tier}_bytes"] for s in stores)))
        checks.append((f"cold blocks, {tier} tier", f'sum(ray_kvres_cold_blocks{{tier="{tier}"}})',
                       sum(s[f"{tier}_blocks"] for s in stores)))
    for event in STORE_EVENTS:
        checks.append((f"cold-store blocks lost ({event})", f'sum(ray_kvres_store_blocks_lost{{event="{event}"}})',
                       sum(int(s.get(event, 0)) for s in stores)))
    checks.append(("tokens generated", 'sum(ray_kvres_tokens_total{kind="generated"})',
                   traffic["generated_tokens"]))
    for method, n in traffic["calls"].items():
        checks.append((f"{method} calls timed", f'sum(ray_kvres_call_seconds_count{{method="{method}"}})', n))
        checks.append((f"{method} calls' first tokens timed",
                       f'sum(ray_kvres_time_to_first_token_seconds_count{{method="{method}"}})', n))
    checks.append(("gaps between streamed tokens timed", "sum(ray_kvres_inter_token_seconds_count)",
                   traffic["streamed_tokens"] - traffic["calls"]["stream"]))
    return checks


def _scrape(port: int) -> list[Any]:
    from metrics_text import parse

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return parse(response.read().decode())


def _prometheus_binary(scrape_only: bool) -> str | None:
    """Debian's prometheus (installed with apt-get where missing), or None: then the endpoint's text
    is read as Prometheus would scrape it."""
    if scrape_only:
        return None
    try:
        return ensure_binary("prometheus", "prometheus")
    except (SystemExit, OSError, subprocess.CalledProcessError) as exc:
        print(f"no prometheus binary ({exc}): checking the metrics endpoint's text instead", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs", help="where the results go (default: docs/)")
    parser.add_argument("--scrape-only", action="store_true",
                        help="no Prometheus: read the metrics endpoint's text as Prometheus would scrape it "
                             "(the default where no prometheus binary can be had); panel queries are then "
                             "checked for series only, their rates and quantiles need a Prometheus")
    args = parser.parse_args(argv)

    from metrics_text import evaluate, series_of

    from kvres.cluster.grafana_dashboard import concrete_query, dashboard_queries

    binary = _prometheus_binary(args.scrape_only)
    version = (subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
               if binary else "no Prometheus: the metrics endpoint's text, read as Prometheus scrapes it")
    metrics_port, prom_port = free_port(), free_port()
    os.environ["KVRES_METRICS_PER_SESSION"] = "1"  # this driver is the cluster's first process: it decides
    manager = start_cluster(f"kvres-prometheus-check-{int(time.time())}", metrics_port, include_dashboard=False)
    base = f"http://127.0.0.1:{prom_port}"

    def scalar(expr: str, page: list[Any] | None) -> float | None:
        return _scalar(base, expr) if page is None else evaluate(expr, page)

    with tempfile.TemporaryDirectory(prefix="kvres-prometheus-") as tmp:
        prometheus = _start_prometheus(binary, f"127.0.0.1:{metrics_port}", Path(tmp), prom_port) if binary else None
        traffic: dict[str, Any] = {"sessions": []}
        try:
            if prometheus is not None:
                _wait_scraping(base)  # traffic before Prometheus's first scrape would be no rate at all
            traffic = drive(manager, pause=None if prometheus is None else lambda: _let_scrape(base))
            checks = _expected(manager, traffic)
            deadline = time.time() + WAIT_S
            while True:  # until every number is exported as kvres reports it
                page = None if prometheus is not None else _scrape(metrics_port)
                metrics = {m: scalar(f"count({m})", page) for m in required_metrics()}
                values = [scalar(q, page) for _, q, _ in checks]
                done = all(metrics.values()) and all(
                    v is not None and v == want for v, (_, _, want) in zip(values, checks, strict=True))
                if done or time.time() > deadline:
                    break
                time.sleep(1)
            panels = []
            if prometheus is not None:
                time.sleep(3)  # a few more scrapes, so rate() has two samples of the final counters
            for expr in dashboard_queries():
                concrete = concrete_query(expr, "5m")
                if prometheus is None:
                    counts = series_of(concrete, _scrape(metrics_port))
                    panels.append({"expr": expr, "query": concrete, "series": min(counts.values(), default=0),
                                   "values": counts})
                    continue
                result = _query(base, concrete)
                series_values = {json.dumps(r["metric"], sort_keys=True): r["value"][1] for r in result}
                # a number in every series: NaN (a quantile of no observations) is no data either
                answered = sum(1 for v in series_values.values() if not math.isnan(float(v)))
                panels.append({"expr": expr, "query": concrete, "series": answered, "values": series_values})
        finally:
            if prometheus is not None:
                prometheus.terminate()
                prometheus.wait(timeout=30)
            for session in traffic["sessions"]:
                session.close()
            manager.shutdown()

    rows = [{"check": what, "query": q, "kvres": want, "prometheus": got,
             "ok": got is not None and not math.isnan(got) and got == want}
            for (what, q, want), got in zip(checks, values, strict=True)]
    metric_rows = [{"metric": m, "series": int(n or 0), "ok": bool(n)} for m, n in metrics.items()]
    panel_ok = [p["series"] > 0 for p in panels]
    ok = all(r["ok"] for r in rows) and all(r["ok"] for r in metric_rows) and all(panel_ok)
    import ray

    report = {"prometheus": version, "scrape_only": prometheus is None, "ray": ray.__version__, "ok": ok,
              "metrics": metric_rows, "checks": rows, "panels": panels}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prometheus_check.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "prometheus_check.md").write_text(_markdown(report))
    for r in rows:
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['check']}: kvres {r['kvres']}, Prometheus {r['prometheus']}")
    for m in metric_rows:
        print(f"{'ok  ' if m['ok'] else 'FAIL'} {m['metric']}: {m['series']} series")
    for p, good in zip(panels, panel_ok, strict=True):
        print(f"{'ok  ' if good else 'FAIL'} panel query, {p['series']} series: {p['query']}")
    print(f"results in {args.out / 'prometheus_check.md'}")
    return 0 if ok else 1


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Prometheus check: the kvres Grafana dashboard against a live cluster",
        "",
        f"Written by `make prometheus-check` (`scripts/prometheus_check.py`): {report['prometheus']}, "
        f"Ray {report['ray']}, a local kvres cluster on `models/passkey.gguf` "
        + ("whose metrics endpoint was read directly (no Prometheus binary: panel queries are checked for "
           "series only). " if report.get("scrape_only") else "scraped every second. ")
        + f"Result: **{'all checks pass' if report['ok'] else 'FAILED'}**.",
        "",
        "## Every kvres metric (every counter, histogram and gauge, and all the dashboard reads) is published",
        "",
        "| metric | series | ok |",
        "|---|---|---|",
        *[f"| `{m['metric']}` | {m['series']} | {'yes' if m['ok'] else 'NO'} |" for m in report["metrics"]],
        "",
        "## Prometheus agrees with `Session.stats()`, the backends' and the cold stores' own stats",
        "",
        "| what | PromQL | kvres | Prometheus | ok |",
        "|---|---|---|---|---|",
        *[f"| {r['check']} | `{r['query']}` | {r['kvres']} | {r['prometheus']} | {'yes' if r['ok'] else 'NO'} |"
          for r in report["checks"]],
        "",
        "## Every panel's query answers (`$backend` = all, `$__rate_interval` = 5m)",
        "",
        "| query | series |",
        "|---|---|",
        *[f"| `{p['query']}` | {p['series']} |" for p in report["panels"]],
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
