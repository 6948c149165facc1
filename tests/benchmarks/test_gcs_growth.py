"""benchmarks.gcs_growth's parts (its run, a ``kvres serve`` for minutes, is the benchmark itself):
the processes it samples, the GCS counters it reads, the slopes and the level-off it reports."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks.gcs_growth.__main__ import MIB, analyse
from benchmarks.gcs_growth.sampling import gcs_task_events, process_name, process_rss, slope_per_minute

# the lines gcs_server prints (Ray 2.60), twice: the last block counts
GCS_OUT = """GcsTaskManager: \n-Total num task events reported: 10\n-Current num of task events stored: 5\n
GcsTaskManager: \n-Total num task events reported: 799\n-Total num status task events dropped: 3
-Total num profile events dropped: 0\n-Current num of task events stored: 390\n-Total num of actor creation tasks: 6
-Total num of actor tasks: 383\n-Total num of normal tasks: 0\n-Total num of driver tasks: 1\n
GcsAutoscalerStateManager: \n- last_seen_autoscaler_state_version_: 0\n"""


def test_process_rss_covers_a_process_and_everything_under_it() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        seen = process_rss(os.getpid())
        assert seen[os.getpid()][1] > 0 and seen[child.pid][0] == "python -c"
    finally:
        child.kill()
        child.wait()
    assert process_name(["ray::BackendServer.stream", ""]) == "ray::BackendServer"
    assert process_name(["/venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server", "--x=1"]) == "gcs_server"


def test_gcs_counters_come_from_the_last_block_the_gcs_printed(tmp_path) -> None:
    (tmp_path / "logs").mkdir()
    assert gcs_task_events(tmp_path) == {}
    (tmp_path / "logs" / "gcs_server.out").write_text(GCS_OUT)
    assert gcs_task_events(tmp_path) == {"reported": 799, "status_dropped": 3, "stored": 390, "actor_tasks": 383,
                                         "normal_tasks": 0}


def test_slopes_after_warmup_and_where_the_gcs_levels_off() -> None:
    samples = []
    for i in range(13):  # every 10 s for 2 min: 30 turns a minute, 3 task events a turn
        t = 10.0 * i
        gcs = (50 + (2.0 * t / 60 if t >= 60 else 5 * t / 60)) * MIB  # 2 MiB/min once warm
        samples.append({"t_s": t, "turns": i * 5,
                        "rss": {"1": ["gcs_server", gcs], "2": ["raylet", 30 * MIB]},
                        "gcs_task_events": {"stored": 15 * i}})
    result = analyse(samples, warmup_s=60, cap=1000)
    assert result["processes"]["1"]["slope_mib_per_min"] == pytest.approx(2.0)
    assert result["processes"]["2"]["slope_mib_per_min"] == pytest.approx(0.0, abs=1e-9)
    assert result["group_slope_mib_per_min"] == pytest.approx(2.0)
    assert result["turns_per_min"] == pytest.approx(30) and result["task_events_per_turn"] == pytest.approx(3)
    per_event = 2.0 * MIB / 30 / 3
    assert result["gcs_bytes_per_task_event"] == pytest.approx(per_event)
    assert result["gcs_level_off_mib_above_start"] == pytest.approx(1000 * per_event / MIB)
    assert slope_per_minute([0.0, 60.0], [1.0, 4.0]) == pytest.approx(3.0)
    with pytest.raises(RuntimeError, match="run longer"):
        analyse(samples[:8], warmup_s=60, cap=1000)
