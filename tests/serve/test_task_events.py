"""``kvres serve`` leaves nothing per turn in Ray's GCS: its embedded cluster bounds the task-event
store and kvres's actors (the backend, planner, cold store and the front's state actor) report no
task events, read back from the cluster by a driver of its own after bound chat turns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

from kvres.cluster.ray_task_events import TASK_EVENT_STORE
from kvres.cluster.ray_upkeep import UPKEEP_CONFIG, UPKEEP_ENVIRONMENT
from tests.cluster.task_event_probe import DRIVER, TASK_EVENT_KEYS, gcs_address_under, log_monitor_environment
from tests.conftest import REPO_ROOT

TEXT_ONLY = {"grammar": "root ::= [a-z ]+"}


def test_serve_turns_leave_no_task_events_and_the_store_is_bounded(server) -> None:
    http, session = server.http(), f"events-{uuid.uuid4().hex[:8]}"
    messages: list[dict[str, str]] = []
    for turn in range(3):
        messages.append({"role": "user", "content": f"Turn {turn}: tell me more."})
        body = {"model": server.model, "messages": messages, "max_tokens": 4, "temperature": 0,
                "stream": turn == 1, **TEXT_ONLY}
        r = http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": session})
        assert r.status_code == 200, r.text
        messages.append({"role": "assistant", "content": "ok"})
    assert http.delete(f"/v1/sessions/{session}").status_code == 200

    address = gcs_address_under(server.process.pid)
    assert address is not None, server.log()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", DRIVER, address], capture_output=True, text=True, timeout=300,
                          env=env, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["witnessed"], seen  # the driver's own task reached the GCS: the turns' calls did too
    assert seen["kvres_task_events"] == [], seen
    assert seen["system_config"] == {key: TASK_EVENT_STORE[key] for key in TASK_EVENT_KEYS}, seen
    assert seen["upkeep"] == UPKEEP_CONFIG, seen  # and Ray's upkeep kept small
    assert log_monitor_environment(address).items() >= UPKEEP_ENVIRONMENT.items()
