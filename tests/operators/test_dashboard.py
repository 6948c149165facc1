"""The Grafana dashboard's panels say what they plot."""

from __future__ import annotations

import re

from kvres.actors.metrics import COUNTERS
from kvres.cluster.grafana_dashboard import dashboard_json

_METRIC = re.compile(r"ray_(kvres_[a-z_]+)")


def _stem(metric: str) -> str:
    return metric.removeprefix("kvres_").removesuffix("_total").removesuffix("_tokens").replace("_", " ")


def test_every_panel_names_the_metrics_it_reads() -> None:
    for panel in dashboard_json()["panels"]:
        for target in panel["targets"]:
            for metric in _METRIC.findall(target["expr"]):
                name = metric.removesuffix("_bucket")
                assert name in panel["description"], (panel["title"], name)


def test_every_counter_series_is_labelled_by_the_counter_it_plots() -> None:
    """A series of one counter carries that counter's name in its legend (the "recalls" series
    once plotted kvres_admissions_total)."""
    counters = {f"kvres_{c}_total" for c in COUNTERS}
    checked = 0
    for panel in dashboard_json()["panels"]:
        for target in panel["targets"]:
            metrics = set(_METRIC.findall(target["expr"]))
            if len(metrics) == 1 and metrics <= counters:
                (metric,) = metrics
                assert _stem(metric) in target["legendFormat"], (panel["title"], metric, target["legendFormat"])
                checked += 1
    assert checked >= 10


def test_the_new_request_metrics_have_panels() -> None:
    read = {m for p in dashboard_json()["panels"] for t in p["targets"] for m in _METRIC.findall(t["expr"])}
    for metric in ("kvres_time_to_first_token_seconds_bucket", "kvres_inter_token_seconds_bucket",
                   "kvres_call_seconds_bucket", "kvres_queue_depth", "kvres_recalls_total",
                   "kvres_recomputed_tokens_total", "kvres_suspends_total", "kvres_explicit_suspends_total",
                   "kvres_resumes_total", "kvres_explicit_resumes_total", "kvres_store_blocks_lost",
                   "kvres_dropped_blocks_total"):
        assert metric in read, metric
