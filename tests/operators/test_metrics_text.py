"""``scripts/metrics_text.py``: the metrics endpoint's text read as Prometheus scrapes it (the
``make prometheus-check --scrape-only`` path where no Prometheus binary can be had)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from metrics_text import evaluate, parse, series_of  # noqa: E402

PAGE = """# HELP ray_kvres_suspends_total kvres suspends
# TYPE ray_kvres_suspends_total counter
ray_kvres_suspends_total{backend="small",session="h-1"} 2.0
ray_kvres_suspends_total{backend="b0",session="h-2"} 1
ray_kvres_queue_depth{backend="b0",SessionName="x"} 0
ray_kvres_call_seconds_count{backend="b0",method="generate"} 5 1796210585415

"""


def test_samples_and_the_promql_subset_the_checks_use() -> None:
    samples = parse(PAGE)
    assert len(samples) == 4 and samples[0].labels == {"backend": "small", "session": "h-1"}
    assert evaluate('sum(ray_kvres_suspends_total{backend="small"})', samples) == 2.0
    assert evaluate("sum(ray_kvres_suspends_total)", samples) == 3.0
    assert evaluate("count(ray_kvres_suspends_total)", samples) == 2.0
    assert evaluate('sum(ray_kvres_call_seconds_count{method="generate"})', samples) == 5.0  # with a timestamp
    assert evaluate('sum(ray_kvres_resident_tokens{session="h-9"})', samples) is None  # no series: no answer
    assert evaluate('sum(ray_kvres_resident_tokens{session="h-9"}) or vector(0)', samples) == 0.0
    assert series_of('sum by (backend) (rate(ray_kvres_suspends_total{backend=~".*"}[5m]))', samples) == {
        "ray_kvres_suspends_total": 2}
    with pytest.raises(ValueError, match="not in the subset"):
        evaluate("rate(ray_kvres_suspends_total[5m])", samples)
