"""Request metrics on a live cluster (real llama.cpp on stories260K, a real local Ray): every call
timed, a stream's first token and its gaps, the calls a backend holds, explicit and implicit
suspends and resumes counted once each, no per-session series unless opted in, and the model load
in the backend's log."""

from __future__ import annotations

import os
import re
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.conftest import free_port, shared_model_path

PROMPT = [3 + (i * 7) % 120 for i in range(200)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    import ray

    from kvres.cluster import BackendConfig, ColdStoreConfig, KvresConfig, connect

    os.environ["RAY_metrics_report_interval_ms"] = "500"  # noqa: SIM112 (Ray reads this exact name)
    for name in ("KVRES_METRICS_PER_SESSION", "KVRES_METRICS_SESSION_IDS"):  # the default: bounded series
        os.environ.pop(name, None)
    port = free_port()
    config = KvresConfig(
        backends=[BackendConfig(name="m0", model_path=shared_model_path(), n_ctx=1024, n_seq_max=2,
                                kv_budget_tokens=600, n_threads=1)],
        cold_store=ColdStoreConfig(ram_budget_bytes=8 << 20, disk_budget_bytes=64 << 20,
                                   disk_dir=tmp_path_factory.mktemp("coldstore")),
    )
    if ray.is_initialized():
        ray.shutdown()
    manager = connect(namespace=f"kvres-ops-{uuid.uuid4().hex[:8]}", config=config, num_cpus=2,
                      include_dashboard=False, _metrics_export_port=port)
    yield manager, port
    manager.shutdown()
    ray.shutdown()


def _scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def _value(body: str, name: str, **labels: str) -> float | None:
    """The sum of ``name``'s series carrying ``labels`` (None: no such series)."""
    found = [float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
             if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items())]
    return sum(found) if found else None


def test_calls_streams_and_suspends_are_measured_and_counted_once(cluster) -> None:
    manager, port = cluster
    a = manager.open_session(backend="m0")
    a.append(PROMPT[:40])
    assert len(list(a.stream(12, ignore_eos=True))) == 12
    assert len(a.generate(4, ignore_eos=True, prompt=PROMPT[40:43])) == 4  # its prompt counts as prompt tokens
    a.suspend()
    a.suspend()  # already suspended: nothing happens, nothing is counted
    a.resume()
    a.resume()  # already live: likewise
    b = manager.open_session(backend="m0")
    b.append(PROMPT[:30])
    c = manager.open_session(backend="m0")  # two slots: the least recently used idle session makes room
    c.append(PROMPT[:30])
    assert a.stats()["state"] == "suspended"
    a.append(PROMPT[:5])  # a call for the suspended session brings it back (an implicit resume)
    counters = a.stats()["counters"]
    assert (counters["explicit_suspends"], counters["explicit_resumes"]) == (1, 1)
    assert counters["resumes"] == 1
    want = {
        ("ray_kvres_call_seconds_count", "stream"): 1, ("ray_kvres_call_seconds_count", "generate"): 1,
        ("ray_kvres_call_seconds_count", "suspend"): 2, ("ray_kvres_call_seconds_count", "resume"): 2,
        ("ray_kvres_call_seconds_count", "append"): 4, ("ray_kvres_call_seconds_count", "open_session"): 3,
        ("ray_kvres_time_to_first_token_seconds_count", "stream"): 1,
        ("ray_kvres_time_to_first_token_seconds_count", "generate"): 1,
        ("ray_kvres_inter_token_seconds_count", None): 11,  # 12 tokens, 11 gaps
        ("ray_kvres_explicit_suspends_total", None): 1, ("ray_kvres_explicit_resumes_total", None): 1,
        ("ray_kvres_resumes_total", None): 1, ("ray_kvres_queue_depth", None): 0,
        ("ray_kvres_tokens_total", "generated"): 16, ("ray_kvres_tokens_total", "prompt"): 40 + 3 + 5 + 30 + 30,
    }
    deadline = time.monotonic() + 60
    while True:
        body = _scrape(port)
        got = {}
        for name, label in want:
            labels = {"backend": "m0"}
            if label is not None:
                labels["kind" if name == "ray_kvres_tokens_total" else "method"] = label
            got[(name, label)] = _value(body, name, **labels)
        if got == want or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert got == want
    assert (_value(body, "ray_kvres_suspends_total", backend="m0") or 0) >= 1  # forced, to make room
    # bounded by default: one series per backend, none per session
    assert not re.search(r'^ray_kvres_\w+\{[^}]*session="', body, re.M)
    for s in (a, b, c):
        s.close()


def test_the_backend_log_shows_the_model_load(cluster) -> None:
    import ray

    session_dir = Path(ray._private.worker._global_node.get_session_dir_path())
    text = "\n".join(p.read_text(errors="replace") for p in (session_dir / "logs").glob("worker-*.err"))
    assert re.search(r"kvres: backend 'm0': loading stories260K.gguf \([0-9.]+ MiB\) on llama \.\.\.$", text, re.M)
    assert re.search(r"kvres: backend 'm0': loading stories260K.gguf .*: done in [0-9.]+ s$", text, re.M)
