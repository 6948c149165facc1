"""The Grafana dashboard kvres ships (``kvres/cluster/grafana/kvres.json``) and where it goes.

Primitives:
- ``dashboard_json() -> dict``: the dashboard, parsed.
- ``dashboard_queries(dashboard=None) -> list[str]``: every PromQL expression of its panels.
- ``dashboard_metrics(dashboard=None) -> set[str]``: every ``ray_kvres_*`` metric those
  expressions read (histograms by the name of their ``_bucket`` series).
- ``concrete_query(expr, rate_window="1m")``: an expression with the dashboard's variables
  (``$backend``, ``$__rate_interval``) replaced, so Prometheus itself can run it.
- ``session_dashboards_dir(address) -> Path``: that folder of the running cluster at ``address``
  (its session folder under whatever temp dir its head was started with).
- ``ray_dashboards_dir(temp_dir=None) -> Path``: the folder whose dashboards the Grafana that Ray
  provisions loads (``RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR``, else
  ``<temp dir>/session_latest/metrics/grafana/dashboards``).
- ``install_dashboard(target=None) -> Path``: copy the dashboard there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

from kvres.policy import KvresError

DASHBOARD_FILE = "kvres.json"
_METRIC = re.compile(r"\bray_kvres_[a-z_]+")


def _resource() -> Any:
    return resources.files("kvres.cluster").joinpath("grafana", DASHBOARD_FILE)


def dashboard_json() -> dict[str, Any]:
    return dict(json.loads(_resource().read_text()))


def dashboard_queries(dashboard: dict[str, Any] | None = None) -> list[str]:
    dashboard = dashboard or dashboard_json()
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def dashboard_metrics(dashboard: dict[str, Any] | None = None) -> set[str]:
    return {m for expr in dashboard_queries(dashboard) for m in _METRIC.findall(expr)}


def concrete_query(expr: str, rate_window: str = "1m") -> str:
    return expr.replace("$__rate_interval", rate_window).replace("$backend", ".*")


def ray_dashboards_dir(temp_dir: str | os.PathLike[str] | None = None) -> Path:
    configured = os.environ.get("RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR")
    if configured and temp_dir is None:
        return Path(configured)
    root = Path(temp_dir) if temp_dir is not None else Path("/tmp/ray")
    return root / "session_latest" / "metrics" / "grafana" / "dashboards"


def session_dashboards_dir(address: str) -> Path:
    """The dashboards folder of the Ray cluster at ``address`` (a head on this machine): its own
    session folder, whatever ``--temp-dir`` the head was started with."""
    import ray

    from .standing import _driver

    with _driver(address, "kvres"):
        node = ray._private.worker.global_worker.node
        if node is None:
            raise KvresError(f"the Ray cluster at {address} gave this driver no node to read its session folder from")
        session_dir = Path(node.get_session_dir_path())
    return session_dir / "metrics" / "grafana" / "dashboards"


def install_dashboard(target: str | os.PathLike[str] | None = None) -> Path:
    """Copy the dashboard into ``target`` (default: ``ray_dashboards_dir()``). Ray rewrites that
    folder when its head node starts, so install after ``ray start --head``."""
    folder = Path(target) if target is not None else ray_dashboards_dir()
    if not folder.is_dir():
        raise KvresError(
            f"no Grafana dashboards folder at {str(folder)!r}: start the Ray head node first "
            "(ray start --head), or name the folder Grafana provisions from"
        )
    destination = folder / "kvres_grafana_dashboard.json"
    with resources.as_file(_resource()) as source:
        shutil.copyfile(source, destination)
    return destination
