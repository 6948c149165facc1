"""What operators see of a running cluster: ``kvres status`` / ``kvres inspect`` / ``kvres top`` (run
in-process against the package's cluster), the kvres actors' reprs, and the Grafana dashboard's
metrics on the cluster's metrics endpoint."""

from __future__ import annotations

import json
import re
import time
import urllib.request

from kvres.actors.metrics import session_label
from kvres.cluster import SessionPolicy
from kvres.cluster.cli import main
from kvres.cluster.cluster_view import ClusterView
from kvres.cluster.grafana_dashboard import dashboard_json, dashboard_metrics, dashboard_queries

PROMPT = list(range(3, 203))


def _run(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def _plain(report: dict) -> dict:
    """JSON-shaped, backends in name order; the load view (pushed by the backends whenever they
    like) by its rows' backends and its totals' keys."""
    report = json.loads(json.dumps(report, default=str))
    report["backends"].sort(key=lambda b: b["backend"])
    load = report.pop("load")
    report["load"] = (sorted(b["backend"] for b in load["backends"]), sorted(load["totals"]))
    return report


def test_status_json_matches_the_session_manager_and_the_table_names_everything(manager, capsys) -> None:
    session = manager.open_session(policy=SessionPolicy.streaming(128, recent_tokens=32), backend="b0")
    session.append(PROMPT)
    _settled_status(manager)  # the spilled blocks reach the store write-behind, after the call
    printed = json.loads(_run(capsys, "status", "--json", "--namespace", manager.namespace))
    assert _plain(printed) == _plain(manager.status())
    table = _run(capsys, "status", "--namespace", manager.namespace)
    for heading in ("BACKENDS", "SESSIONS", "COLD STORES", "ACTORS"):
        assert heading in table
    assert re.search(r"^kvres-backend-b0\s+BackendServer\(b0: llama stories260K.gguf, 6 slots, 2000-token budget\)$",
                     table, re.M)
    assert re.search(r"^b0\s+llama\s+stories260K.gguf\s+1\s+", table, re.M)  # live state: the BACKENDS table
    for backend in manager.backends():
        assert re.search(rf"^{re.escape(backend)}\s", table, re.M), backend
    row = next(line for line in table.splitlines() if line.startswith(session.session_id))
    assert row.split()[1:] == ["b0", "live", str(session.stats()["resident_tokens"])]
    session.close()


def _settled_status(manager) -> dict:
    """The cluster's status once the work that follows the last call (write-behind blocks reaching
    the cold store, the idle backend preparing a recall) is done: two reads in a row agree."""
    status, deadline = _plain(manager.status()), time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(0.05)
        again = _plain(manager.status())
        if again == status:
            break
        status = again
    return status


def _settled(session) -> dict:
    """The session's stats once the idle backend's work after its last call (preparing its next
    recall, counted in ``recall_prep_us``) is done: reads agree for half a second (on a loaded
    machine that work can start later than one short pause after the answer)."""
    stats, deadline, since = session.stats(), time.monotonic() + 30, time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < 0.5:
        time.sleep(0.05)
        again = session.stats()
        if again != stats:
            stats, since = again, time.monotonic()
    return stats


def test_inspect_draws_the_resident_ranges_over_the_token_log(manager, capsys) -> None:
    session = manager.open_session(policy=SessionPolicy.streaming(128, recent_tokens=32), backend="b0")
    session.append(PROMPT)
    session.generate(64)
    stats = _settled(session)
    assert json.loads(_run(capsys, "inspect", session.session_id, "--json", "--namespace", manager.namespace)) \
        == json.loads(json.dumps(stats))
    text = _run(capsys, "inspect", session.session_id, "--namespace", manager.namespace)
    assert f"session {session.session_id!r} on backend 'b0': live" in text
    assert "streaming, budget 128 tokens" in text
    bar = re.search(r"\|([#+.]+)\|", text).group(1)
    assert bar[0] == "#" and bar[-1] == "#" and "." in bar  # sinks and recent resident, the middle not
    assert text.count("#") < len(bar)
    assert f"{stats['token_count']} in the log, {stats['resident_tokens']} resident" in text
    for tier, v in stats["cold"].items():
        assert re.search(rf"^\s+{tier}\s+{v['blocks']}\s", text, re.M)
    assert f"evictions {stats['counters']['evictions']}" in text
    session.close()
    assert main(["inspect", "no-such-session", "--namespace", manager.namespace]) == 1
    assert "no-such-session" in capsys.readouterr().err


def _backend_row(text: str, backend: str) -> list[str]:
    return next(line.split() for line in text.splitlines() if line.split()[:1] == [backend])


def test_the_backend_repr_is_static_and_live_state_is_in_status_and_top(manager, capsys) -> None:
    """Ray records an actor's repr once: the backend's says what never changes; status and top
    say what is live (sessions, resident and peak tokens, calls held)."""
    view = ClusterView(manager.namespace)
    before = view.reprs()
    assert set(before) == set(view.actors) and all(before.values())
    assert before["kvres-backend-b0"] == "BackendServer(b0: llama stories260K.gguf, 6 slots, 2000-token budget)"
    stores = [n for n in before if n.startswith("kvres-coldstore-")]
    assert stores and all(before[n].startswith("MeteredColdStoreServer(ram ") for n in stores)
    assert before["kvres-planner"].startswith("PlannerServer(")
    row = _backend_row(_run(capsys, "top", "--once", "--namespace", manager.namespace), "b0")
    live, suspended, resident = int(row[2]), int(row[3]), int(row[4].split("/")[0])
    session = manager.open_session(backend="b0")
    session.append(PROMPT[:50])
    assert view.reprs()["kvres-backend-b0"] == before["kvres-backend-b0"]
    top = _run(capsys, "top", "--once", "--namespace", manager.namespace)
    row = _backend_row(top, "b0")
    assert (int(row[2]), int(row[3]), int(row[4].split("/")[0])) == (live + 1, suspended, resident + 50)
    assert int(row[6]) >= resident + 50 and row[7] == "0"  # peak, calls held (none at rest)
    assert re.search(rf"^{session.session_id}\s+b0\s+live\s+50$", top, re.M)
    session.suspend()
    row = _backend_row(_run(capsys, "status", "--namespace", manager.namespace), "b0")
    assert (int(row[3]), int(row[4])) == (live, suspended + 1)
    session.close()
    assert main(["top", "--once", "--interval", "0", "--namespace", manager.namespace]) == 1
    assert "--interval must be > 0" in capsys.readouterr().err


def test_the_grafana_dashboard_reads_what_kvres_publishes() -> None:
    dashboard = dashboard_json()
    assert dashboard["uid"] == "kvres-residency" and len(dashboard["panels"]) >= 7
    assert all(panel.get("targets") for panel in dashboard["panels"])
    assert dashboard_metrics() == {
        "ray_kvres_backend_resident_tokens", "ray_kvres_resident_tokens", "ray_kvres_cold_bytes",
        "ray_kvres_cold_blocks", "ray_kvres_evictions_total", "ray_kvres_spills_total", "ray_kvres_recalls_total",
        "ray_kvres_admissions_total", "ray_kvres_suspends_total", "ray_kvres_explicit_suspends_total",
        "ray_kvres_resumes_total", "ray_kvres_explicit_resumes_total", "ray_kvres_recomputed_tokens_total",
        "ray_kvres_recalled_tokens_total", "ray_kvres_dropped_blocks_total", "ray_kvres_plan_latency_ms_bucket",
        "ray_kvres_time_to_first_token_seconds_bucket", "ray_kvres_inter_token_seconds_bucket",
        "ray_kvres_call_seconds_bucket", "ray_kvres_queue_depth", "ray_kvres_tokens_total",
        "ray_kvres_store_blocks_lost", "ray_kvres_idle_suspends_total", "ray_kvres_ttl_closes_total",
        "ray_kvres_quota_drops_total", "ray_kvres_tenant_resident_tokens", "ray_kvres_tenant_cold_bytes",
    }
    assert all("$" not in q.replace("$backend", "").replace("$__rate_interval", "") for q in dashboard_queries())


def test_grafana_install_copies_the_dashboard(tmp_path, capsys) -> None:
    assert main(["grafana", "--install", "--dir", str(tmp_path)]) == 0
    installed = tmp_path / "kvres_grafana_dashboard.json"
    assert str(installed) in capsys.readouterr().out
    assert json.loads(installed.read_text()) == dashboard_json()
    assert main(["grafana", "--install", "--dir", str(tmp_path / "missing")]) == 1
    assert "missing" in capsys.readouterr().err


def _scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def test_every_metric_of_the_dashboard_is_on_the_metrics_endpoint(manager, metrics_port) -> None:
    """Drive what each panel shows (eviction and spills, a resume that recalls blocks, a session
    suspended to make room, generated tokens), then find every metric the dashboard reads."""
    streaming = manager.open_session(policy=SessionPolicy.streaming(128, recent_tokens=32), backend="b0")
    streaming.append(PROMPT)
    streaming.generate(32)
    streaming.suspend()
    streaming.resume()
    assert len(list(streaming.stream(8, ignore_eos=True))) == 8  # time to first token, inter-token gaps
    idle = manager.open_session(backend="small")
    idle.append(PROMPT[:180])
    busy = manager.open_session(backend="small", policy=SessionPolicy.streaming(200, recent_tokens=32))
    busy.append(PROMPT[:150])
    assert idle.stats()["state"] == "suspended"
    assert streaming.stats()["counters"]["admissions"] > 0
    wanted = dashboard_metrics()
    deadline = time.time() + 30
    while True:
        body = _scrape(metrics_port)
        missing = {m for m in wanted if not re.search(rf"^{m}\{{", body, re.M)}
        if not missing or time.time() > deadline:
            break
        time.sleep(0.5)
    assert not missing, f"metrics the Grafana dashboard reads but the cluster does not publish: {sorted(missing)}"
    time.sleep(3)  # at rest: Ray forgets a gauge two report intervals (here 2 s) after it was last set
    body = _scrape(metrics_port)
    for gauge in ("ray_kvres_backend_resident_tokens", "ray_kvres_cold_bytes", "ray_kvres_resident_tokens"):
        assert re.search(rf"^{gauge}\{{", body, re.M), f"{gauge} vanished from the endpoint at rest"
    resident = [float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
                if line.startswith("ray_kvres_resident_tokens{") and f'session="{session_label(busy.session_id)}"' in line]
    assert resident == [busy.stats()["resident_tokens"]]
    for s in (streaming, idle, busy):
        s.close()



# ---- kvres start / stop: errors before anything starts (tests/cluster/test_standing_cluster.py runs them) ----


def test_start_and_stop_name_an_unreachable_address(capsys) -> None:
    import socket

    from tests.cluster.conftest import free_port

    closed = f"127.0.0.1:{free_port()}"
    for argv in (["stop", "--address", closed], ["start", "--address", closed]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert f"no Ray cluster at {closed}: nothing accepts connections" in err, err
    assert main(["stop", "--address", "nonsense"]) == 1
    assert "Ray address 'nonsense' is not HOST:PORT" in capsys.readouterr().err
    with socket.socket() as listener:  # something listens there, but it is not a Ray GCS
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = f"127.0.0.1:{listener.getsockname()[1]}"
        assert main(["stop", "--address", taken]) == 1
    assert f"no Ray cluster at {taken}: something listens" in capsys.readouterr().err


def test_start_and_stop_refuse_bad_options(tmp_path, capsys) -> None:
    assert main(["start", "--config", "[1, 2]"]) == 1
    assert "--config holds a JSON list" in capsys.readouterr().err
    missing = tmp_path / "missing.json"
    assert main(["start", "--config", str(missing)]) == 1
    assert f"--config {str(missing)!r} is neither a JSON object nor a path to a readable file" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{not json")
    assert main(["start", "--config", str(tmp_path / "bad.json")]) == 1
    assert "is not valid JSON" in capsys.readouterr().err
    assert main(["start", "--config", '{"backends": []}']) == 1
    assert "backends" in capsys.readouterr().err
    assert main(["stop", "--keep-blocks", "--ray"]) == 1
    assert "--keep-blocks with --ray" in capsys.readouterr().err
