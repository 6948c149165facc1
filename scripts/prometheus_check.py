"""Prometheus against a live kvres cluster: every metric the Grafana dashboard reads is there, every
panel's query answers, and the numbers match what ``Session.stats()`` and the cold stores say.

Run: ``make prometheus-check`` (or ``.venv/bin/python scripts/prometheus_check.py``). Installs
Debian's ``prometheus`` with apt-get when it is missing, starts a local kvres cluster on the passkey
model with traffic (``live_cluster.drive``), scrapes its metrics endpoint every second, then asks
Prometheus over its HTTP API. Writes ``docs/prometheus_check.json`` and ``docs/prometheus_check.md``;
exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import math
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

    from kvres.actors.metrics import session_label

    checks: list[tuple[str, str, float]] = []
    for session in traffic["sessions"]:
        stats = session.stats()
        sid = session.session_id
        label = session_label(sid)  # the hashed label the metrics carry
        # a suspended or closed session's series ages out: no series reads as 0
        checks.append((f"resident tokens of {sid} ({stats['state']})",
                       f'sum(ray_kvres_resident_tokens{{session="{label}"}}) or vector(0)', stats["resident_tokens"]))
        for name in ("evictions", "spills", "admissions", "suspends"):
            if stats["counters"].get(name):
                checks.append((f"{name} of {sid}", f'sum(ray_kvres_{name}_total{{session="{label}"}})',
                               stats["counters"][name]))
    for backend in manager.status()["backends"]:
        name = backend["backend"]
        checks.append((f"resident tokens of backend {name}",
                       f'sum(ray_kvres_backend_resident_tokens{{backend="{name}"}})', backend["resident_tokens"]))
    stores = ray.get([s.stats.remote() for s in manager.cold_stores.values()])
    for tier in ("ram", "disk"):
        checks.append((f"cold bytes, {tier} tier", f'sum(ray_kvres_cold_bytes{{tier="{tier}"}})',
                       sum(s[f"{tier}_bytes"] for s in stores)))
        checks.append((f"cold blocks, {tier} tier", f'sum(ray_kvres_cold_blocks{{tier="{tier}"}})',
                       sum(s[f"{tier}_blocks"] for s in stores)))
    checks.append(("tokens generated", 'sum(ray_kvres_tokens_total{kind="generated"})',
                   traffic["generated_tokens"]))
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs", help="where the results go (default: docs/)")
    args = parser.parse_args(argv)

    from kvres.cluster.grafana_dashboard import concrete_query, dashboard_metrics, dashboard_queries

    binary = ensure_binary("prometheus", "prometheus")
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    metrics_port, prom_port = free_port(), free_port()
    manager = start_cluster(f"kvres-prometheus-check-{int(time.time())}", metrics_port, include_dashboard=False)
    with tempfile.TemporaryDirectory(prefix="kvres-prometheus-") as tmp:
        prometheus = _start_prometheus(binary, f"127.0.0.1:{metrics_port}", Path(tmp), prom_port)
        base = f"http://127.0.0.1:{prom_port}"
        traffic: dict[str, Any] = {"sessions": []}
        try:
            traffic = drive(manager)
            checks = _expected(manager, traffic)
            deadline = time.time() + WAIT_S
            while True:  # until Prometheus has scraped every number as kvres reports it
                metrics = {m: _scalar(base, f"count({m})") for m in sorted(dashboard_metrics())}
                values = [_scalar(base, q) for _, q, _ in checks]
                done = all(metrics.values()) and all(
                    v is not None and v == want for v, (_, _, want) in zip(values, checks, strict=True))
                if done or time.time() > deadline:
                    break
                time.sleep(1)
            time.sleep(3)  # a few more scrapes, so rate() has two samples of the final counters
            panels = []
            for expr in dashboard_queries():
                concrete = concrete_query(expr, "1m")
                result = _query(base, concrete)
                panels.append({"expr": expr, "query": concrete, "series": len(result), "values": {
                    json.dumps(r["metric"], sort_keys=True): r["value"][1] for r in result}})
        finally:
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

    report = {"prometheus": version, "ray": ray.__version__, "ok": ok, "metrics": metric_rows,
              "checks": rows, "panels": panels}
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
        f"Ray {report['ray']}, a local kvres cluster on `models/passkey.gguf` scraped every second. "
        f"Result: **{'all checks pass' if report['ok'] else 'FAILED'}**.",
        "",
        "## Every metric the dashboard reads is published",
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
        "## Every panel's query answers (`$backend` = all, `$__rate_interval` = 1m)",
        "",
        "| query | series |",
        "|---|---|",
        *[f"| `{p['query']}` | {p['series']} |" for p in report["panels"]],
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
