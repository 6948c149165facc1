"""The pure parts of ``benchmarks.chat_fleet`` (kvres serve against llama-server): the workload is
the same on every call and per repeat another, /proc is read right (a process's CPU seconds, a
tree's, an ended child's counted once), the pooled figures follow from the runs, and the peer's
binary is found or named with how to build it; and the host side (kvres's backend host alone) run
for real on the shared model."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.chat_fleet.proc_cpu import Entry, cpu_between, label, parse_stat, read_stat, snapshot
from benchmarks.chat_fleet.report import compare, pooled
from benchmarks.chat_fleet.sides import llama_server_flags
from benchmarks.chat_fleet.workload import PRESETS, ChatWorkload, build_conversations
from benchmarks.peers import PeerMissingError, llama_server_path
from tests.conftest import shared_model_path


def count(text: str) -> int:
    return len(text.split())


def render(messages: list[dict[str, str]]) -> str:
    return " ".join(f"<{m['role']}> {m['content']}" for m in messages) + " <assistant>"


def test_conversations_are_the_same_every_call_and_another_set_each_repeat() -> None:
    w = ChatWorkload(conversations=5, slots=2, clients=2, turns=3, history_tokens=60, user_tokens=7, reply_tokens=4)
    first, again = build_conversations(w, count, render), build_conversations(w, count, render)
    assert first == again
    other = build_conversations(w, count, render, repeat=1)
    assert all(a.history != b.history for a, b in zip(first, other, strict=True))
    assert len({tuple(c.user_turns) for c in first}) == w.conversations
    for c in first:
        assert c.history[-1]["role"] == "user" and c.history[0]["role"] == "user"
        assert [m["role"] for m in c.history[1::2]] == ["assistant"] * (len(c.history) // 2)
        assert count(render(c.history)) >= w.history_tokens
        assert count(render(c.history[:-2])) < w.history_tokens  # grown no further than needed
        assert len(c.user_turns) == w.turns and all(count(u) == w.user_tokens for u in c.user_turns)
    assert build_conversations(ChatWorkload(**{**vars(w), "seed": 1}), count, render) != first


def test_workload_sizes() -> None:
    w = ChatWorkload(conversations=5, clients=2)
    assert w.conversations_of(0) == [0, 2, 4] and w.conversations_of(1) == [1, 3]
    assert w.timed_turns == 5 * w.turns
    with pytest.raises(ValueError, match="clients"):
        ChatWorkload(conversations=2, clients=3)
    with pytest.raises(ValueError, match=">= 1"):
        ChatWorkload(turns=0)
    assert {name: (p["conversations"], p["slots"], p["history_tokens"]) for name, p in PRESETS.items()} == {
        "engine-free": (16, 4, 256), "realistic-16": (16, 4, 512), "realistic-64": (64, 4, 1024)}


def test_parse_stat_reads_past_a_command_name_with_spaces_and_parentheses() -> None:
    fields = ["S", "41"] + ["0"] * 9 + ["250", "50", "100", "0"] + ["0"] * 4 + ["12345"] + ["0"] * 30
    stat = parse_stat(f"4242 (a (b) c) {' '.join(fields)}", ticks_per_s=100.0)
    assert (stat.pid, stat.ppid, stat.start_ticks) == (4242, 41, 12345)
    assert stat.cpu_s == pytest.approx(3.0) and stat.children_cpu_s == pytest.approx(1.0)
    assert stat.total_s == pytest.approx(4.0)
    with pytest.raises(ValueError):
        parse_stat("garbage", 100.0)


def test_labels_name_ray_workers_pythons_and_executables() -> None:
    assert label(["ray::BackendServer.step"], "ray::Backend") == "ray::BackendServer"
    assert label(["ray::ServeReplica:kvres:KvresOpenAI"], "x") == "ray::ServeReplica:kvres:KvresOpenAI"
    assert label(["/v/bin/python3", "-u", "/v/ray/dashboard/agent.py", "--x"], "python3") == "agent.py"
    assert label(["/v/bin/python", "-m", "kvres.cluster.cli", "serve"], "python") == "python -m kvres.cluster.cli"
    assert label(["/v/ray/core/src/ray/raylet/raylet", "--a"], "raylet") == "raylet"
    assert label([], "kworker") == "kworker"


def test_an_ended_child_is_counted_once_in_its_parent() -> None:
    before = {(1, 10): Entry("root", 0, 1.0), (2, 20): Entry("child", 1, 0.5), (3, 30): Entry("grandchild", 2, 0.25)}
    # the child and its child ended and were reaped: their 0.5 + 0.25 s and 1.0 s more sit in root's count
    after = {(1, 10): Entry("root", 0, 1.0 + 0.5 + 0.25 + 1.0), (4, 40): Entry("child", 1, 0.125)}
    cpu = cpu_between(before, after)
    assert cpu["root"].cpu_s == pytest.approx(1.0) and cpu["child"].cpu_s == pytest.approx(0.125)
    assert cpu["child"].processes == 1 and "grandchild" not in cpu
    assert sum(v.cpu_s for v in cpu.values()) == pytest.approx(1.125)


def test_a_busy_child_shows_in_the_tree_and_stays_counted_once_reaped() -> None:
    before = snapshot(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile time.process_time() < 0.3: pass\ntime.sleep(30)"])
    try:
        deadline = time.monotonic() + 60
        while (s := read_stat(child.pid)) is None or s.cpu_s < 0.25:
            assert time.monotonic() < deadline, "the child never used its CPU"
            time.sleep(0.05)
        running = snapshot(os.getpid())
        assert (child.pid, s.start_ticks) in running
        assert sum(v.cpu_s for v in cpu_between(before, running).values()) >= 0.25
    finally:
        child.kill()
        child.wait()
    ended = snapshot(os.getpid())
    assert all(pid != child.pid for pid, _ in ended)
    assert sum(v.cpu_s for v in cpu_between(running, ended).values()) < 0.2  # not counted a second time


def _run(side: str, turns_per_s: float, cpu_s: float, ttft_s: float) -> dict[str, object]:
    return {"side": side, "turns": 4, "wall_s": 4 / turns_per_s, "failed_turns": 0, "turns_per_s": turns_per_s,
            "ttft_samples_s": [ttft_s] * 4, "latency_samples_s": [2 * ttft_s] * 4, "ttft_p50_ms": ttft_s * 1e3,
            "latency_p50_ms": 2 * ttft_s * 1e3, "cpu_s": cpu_s, "cpu_s_per_turn": cpu_s / 4,
            "cpu_by_process": {"a": {"cpu_s_per_turn": cpu_s / 4, "processes": 1}},
            "prompt_tokens": 400, "prefilled_tokens": 200}


def test_pooled_rows_and_ratios_follow_from_the_runs() -> None:
    runs = {"kvres": [_run("kvres", 2.0, 2.0, 0.1), _run("kvres", 4.0, 2.0, 0.1)],
            "llama-server": [_run("llama-server", 1.0, 4.0, 0.2), _run("llama-server", 2.0, 4.0, 0.2)]}
    rows = {name: pooled(rs) for name, rs in runs.items()}
    k = rows["kvres"]
    assert k["turns"] == 8 and k["turns_per_s"] == pytest.approx(8 / 3.0) and k["cpu_s_per_turn"] == pytest.approx(0.5)
    assert k["ttft_p50_ms"] == pytest.approx(100.0) and k["latency_p99_ms"] == pytest.approx(200.0)
    assert k["cpu_by_process"] == {"a": {"cpu_s_per_turn": pytest.approx(0.5), "processes": 1}}
    ratios = compare(runs, rows)
    assert ratios["kvres_over_llama-server"]["cpu_s_per_turn"] == pytest.approx(0.5)
    assert ratios["kvres_over_llama-server_paired_median"]["turns_per_s"] == pytest.approx(2.0)
    assert ratios["kvres_over_llama-server"]["ttft_p50"] == pytest.approx(0.5)
    assert compare({"kvres": runs["kvres"]}, {"kvres": k}) == {}


def test_the_peer_binary_is_found_or_named_with_how_to_build_it(tmp_path: Path) -> None:
    from kvres.actors.pins import LLAMA_CPP_PYTHON

    with pytest.raises(PeerMissingError, match="make peers"):
        llama_server_path(tmp_path)
    binary = tmp_path / "build" / "peers" / f"llama-server-{LLAMA_CPP_PYTHON}"
    binary.parent.mkdir(parents=True)
    binary.write_bytes(b"")
    assert llama_server_path(tmp_path) == binary


def test_llama_server_gets_the_slots_and_kv_kvres_gets() -> None:
    flags = llama_server_flags(ChatWorkload(conversations=16, slots=4), 451, threads=2, cache_ram_mib=4096)
    assert flags[flags.index("-c") + 1] == "1804" and flags[flags.index("-np") + 1] == "4"
    assert "--kv-unified" in flags and flags[flags.index("--cache-ram") + 1] == "4096"
    assert flags[flags.index("-t") + 1] == "2" == flags[flags.index("-tb") + 1]


def test_the_hop_profile_groups_processes_into_hops_and_splits_the_front_s_time() -> None:
    from benchmarks.chat_fleet.hops import OTHER, hop_profile, hop_table, serve_histogram

    def metrics(ttft_sum: float, ttft_n: int, dur_sum: float, dur_n: int) -> str:
        route = 'route="/v1/chat/completions"'
        return "\n".join([
            f'kvres_serve_time_to_first_token_seconds_bucket{{{route},le="0.1"}} {ttft_n}',
            f"kvres_serve_time_to_first_token_seconds_sum{{{route}}} {ttft_sum}",
            f"kvres_serve_time_to_first_token_seconds_count{{{route}}} {ttft_n}",
            'kvres_serve_time_to_first_token_seconds_sum{route="/v1/responses"} 99.0',
            f"kvres_serve_request_duration_seconds_sum{{{route}}} {dur_sum}",
            f"kvres_serve_request_duration_seconds_count{{{route}}} {dur_n}"])

    assert serve_histogram(metrics(1.5, 3, 0, 0), "kvres_serve_time_to_first_token_seconds") == (1.5, 3)
    run = {"cpu_by_process": {"ray::ServeReplica:kvres:KvresOpenAI": {"cpu_s_per_turn": 0.030},
                              "ray::ProxyActor": {"cpu_s_per_turn": 0.020},
                              "ray::MeteredColdStoreServer": {"cpu_s_per_turn": 0.001},
                              "ray::ColdStoreServer": {"cpu_s_per_turn": 0.002},
                              "log_monitor.py": {"cpu_s_per_turn": 0.004}},
           "ttft_samples_s": [0.1, 0.3], "latency_samples_s": [0.4, 0.6]}
    profile = hop_profile(run, metrics(1.0, 10, 2.0, 10), metrics(1.3, 12, 2.8, 12))
    cpu = profile["cpu_ms_per_turn"]
    assert cpu["Serve replica"] == pytest.approx(30) and cpu["HTTP proxy"] == pytest.approx(20)
    assert cpu["cold store"] == pytest.approx(3) and cpu[OTHER] == pytest.approx(4) and cpu["planner"] == 0
    assert profile["cpu_ms_per_turn_total"] == pytest.approx(57)
    t = profile["time_ms"]
    assert t["client_ttft_mean"] == pytest.approx(200) and t["replica_ttft_mean"] == pytest.approx(150)
    assert t["before_replica_ttft_mean"] == pytest.approx(50)
    assert t["replica_turn_mean"] == pytest.approx(400) and t["outside_replica_turn_mean"] == pytest.approx(100)
    assert "| Serve replica | 30.0 |" in hop_table(profile)
    assert hop_profile(run, "", "")["time_ms"]["replica_ttft_mean"] is None


def test_the_host_side_runs_the_turns_on_the_backend_host_alone(tmp_path: Path) -> None:
    """``--sides kvres-host``: the same conversations on kvres's backend host in a child process (no
    Ray, no HTTP), every timed turn done, the replies sent back kept (only the new messages
    prefilled), its figures in the driver's shape."""
    from benchmarks.chat_fleet.__main__ import tokens_per_conversation
    from benchmarks.chat_fleet.host_side import HOST_SIDE, HostSpec, run_host_side
    from benchmarks.chat_fleet.sides import ChatModel, prepare_model

    shared_model_path()  # says so where the shared model is missing
    model = prepare_model("stories260K", tmp_path)
    w = ChatWorkload(conversations=4, slots=2, clients=2, turns=2, history_tokens=60, user_tokens=8, reply_tokens=4)
    chat = ChatModel(model)
    per = tokens_per_conversation(chat, w, build_conversations(w, chat.count, chat.render))
    run = run_host_side(HostSpec(str(model), vars(w), 0, per, 1, "split", 64 << 20, str(tmp_path)))
    assert run["side"] == HOST_SIDE and run["failed_turns"] == 0, run["failures"]
    assert run["turns"] == w.timed_turns and run["completion_tokens"] == w.timed_turns * w.reply_tokens
    assert 0 < run["prefilled_tokens"] < run["prompt_tokens"]  # each turn prefilled its new messages only
    assert run["prefilled_tokens"] / run["turns"] < w.history_tokens  # the new messages, never the history again
    assert run["cpu_s_per_turn"] > 0 and all(t >= 0 for t in run["ttft_samples_s"])
    assert pooled([run])["turns_per_s"] == pytest.approx(run["turns_per_s"])
    loop = run["step_loop"]  # the step loop per turn: a turn is its prompt's step and a step per token after
    assert loop["steps"] >= w.reply_tokens / w.slots and loop["engine_tokens"] >= w.reply_tokens
    assert loop["engine_ms"] > 0 and loop["other_step_ms"] >= 0 and 0 < loop["busy_share"] <= 1.0


def test_the_loop_trace_finds_the_timed_part_after_the_quiet_one() -> None:
    """``loop_trace``: the openings (busy), the wait for quiet processes (no step for a second and
    more), the timed turns (busy), then nothing; the timed part is the second busy stretch only."""
    from benchmarks.chat_fleet.loop_trace import timed_part

    def at(t: float, steps: int) -> tuple[float, dict[str, float]]:
        return t, {"steps": steps, "engine_s": steps / 100, "step_s": steps / 80, "engine_tokens": 4 * steps}

    samples = [at(0.0, 0), at(0.25, 5), at(0.5, 9), at(0.75, 9), at(1.0, 9), at(1.25, 9), at(1.5, 9), at(1.75, 9),
               at(2.0, 14), at(2.25, 30), at(2.5, 41), at(2.75, 41), at(3.0, 41)]
    (t0, first), (t1, last) = timed_part(samples)
    assert (t0, first["steps"], t1, last["steps"]) == (1.75, 9, 2.5, 41)
    # sampling started before the run's first step: that wait is not the quiet stretch after the openings
    waiting = [at(0.25 * i, 0) for i in range(6)]
    (t0, first), (t1, last) = timed_part(waiting + [(t + 1.5, loop) for t, loop in samples[1:]])
    assert (t0, first["steps"], t1, last["steps"]) == (3.25, 9, 4.0, 41)
    with pytest.raises(ValueError, match="no quiet stretch"):
        timed_part([at(0.25 * i, 3 * i) for i in range(8)])  # never quiet: no timed part to tell


def test_a_driver_stopped_with_sigterm_runs_its_finally_and_exits_143(tmp_path: Path) -> None:
    """What ``run``'s ``finally`` does (stop the servers it started) happens when the driver is killed."""
    marker = tmp_path / "stopped"
    code = ("import pathlib, sys, time\n"
            "from benchmarks.chat_fleet.__main__ import stop_servers_on_sigterm\n"
            "stop_servers_on_sigterm()\n"
            "try:\n    print('ready', flush=True)\n    time.sleep(60)\n"
            "finally:\n    pathlib.Path(sys.argv[1]).write_text('servers stopped')\n")
    child = subprocess.Popen([sys.executable, "-c", code, str(marker)], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[2])
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        child.terminate()
        assert child.wait(timeout=30) == 143
    finally:
        child.kill()
    assert marker.read_text() == "servers stopped"
