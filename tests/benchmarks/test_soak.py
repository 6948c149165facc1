"""The soak's short version: ``python -m benchmarks.soak`` for 3 minutes on a standing cluster with
``kvres serve`` (its default front), 16 HTTP clients (chat sessions and Responses chains, more
sessions than slots, spill on), each fault of that front once. What must hold whatever the machine's speed: no session
lost, no token lost or duplicated (every conversation's log is what its client sent and
received), only tries in flight at a kill failed and each such turn completed on its retry, and
every fault recovered. No timing threshold: the figures are reported, not judged here."""

from __future__ import annotations

import json

import pytest

from benchmarks.soak.cluster import faults_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


def test_three_minutes_with_each_fault_once(tmp_path) -> None:
    from benchmarks.soak.__main__ import main

    result = main(["--duration-s", "180", "--faults-each", "1", "--faults-from-s", "20", "--faults-to-s", "140",
                   "--warmup-s", "60", "--window-s", "20", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "soak.json").read_text())
    assert (tmp_path / "soak.png").stat().st_size > 0
    assert saved["invariants"] == result["invariants"]
    assert sorted(f["kind"] for f in saved["faults"]) == sorted(faults_of(saved["settings"]["front"])), (
        saved["faults_not_made"])
    assert saved["settings"]["clients"] == 16 and saved["settings"]["sessions"] > saved["settings"]["slots"]
    audit = saved["audit"]
    assert saved["turns_completed"] > 0 and audit["audited"] > 0
    assert all(audit["by_api"].get(api, {}).get("audited", 0) > 0 for api in ("chat", "responses")), audit["by_api"]
    assert audit["sessions_lost"] == 0, audit["examples"]
    assert audit["mismatched"] == 0 and audit["tokens_lost"] == 0 and audit["tokens_duplicated"] == 0, (
        audit["examples"], audit["rewound_examples"])
    assert saved["failed_not_at_a_kill"] == 0, saved["examples_not_at_a_kill"]
    assert saved["retries_failed"] == 0 and saved["turns_never_completed_after_a_failure"] == 0, (
        saved["examples_not_at_a_kill"])
    assert all(row["recover_s"] is not None for row in saved["faults"]), saved["faults"]
    assert all(saved["invariants"].values()), saved["invariants"]
    rss = saved["rss"]
    assert rss["total"] is not None and {"gcs_server", "raylet"} <= set(rss["labels"])
    front_process = {"local": "ray::BackendServer", "direct": "ray::FrontServer", "serve": "ray::ServeReplica"}
    assert any(label.startswith(front_process[saved["settings"]["front"]]) for label in rss["labels"]), rss["labels"]

