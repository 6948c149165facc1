"""The examples and the command line, run as a user would, on the project's default model: a
driver script and a chat loop (three lines piped to it) on an embedded local cluster, and a Ray job
submitted with ``ray job submit`` to a cluster started with ``ray start`` (then ``kvres status``
against it)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import free_port
from tests.conftest import REPO_ROOT, shared_model_path

BIN = Path(sys.executable).parent


def _env(**extra: str) -> dict[str, str]:
    # a throwaway cluster bound to 127.0.0.1: no token authentication between its own processes
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update({"RAY_AUTH_MODE": "disabled", **extra})
    return env


def test_driver_example() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "driver.py")],
        capture_output=True, text=True, timeout=300, env=_env(), cwd=REPO_ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["generated"] == 400 and result["resident_tokens"] <= 128
    assert result["counters"]["evictions"] > 0


CHAT_LINES = ("hello", "what is 2 plus 3?", "thank you")


def test_chat_example_answers_each_piped_line() -> None:
    """``examples/chat.py`` with stdin piped: one reply per line, in order, then it ends at EOF."""
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "chat.py"), "--max-tokens", "48"],
        input="".join(f"{line}\n\n" for line in CHAT_LINES),  # blank lines are no turns
        capture_output=True, text=True, timeout=300, env=_env(), cwd=REPO_ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    asked = [i for i, line in enumerate(lines) if line.startswith("> ")]
    assert [lines[i] for i in asked] == [f"> {line}" for line in CHAT_LINES], out.stdout
    replies = [lines[i + 1 : j] for i, j in zip(asked, [*asked[1:], len(lines)], strict=True)]
    assert all("".join(reply).strip() for reply in replies), out.stdout  # every turn answered


def test_chat_example_leaves_out_the_oldest_turns_past_what_the_session_holds() -> None:
    """A conversation longer than a session of the chat model holds (its trained 512 tokens): once it no longer
    fits, the oldest turns are left out (said on stderr) and every turn is still answered."""
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "looked", "at", "the", "big", "red", "dog", "near",
             "an", "old", "tree"]
    turns = [" ".join(words[(i + j) % len(words)] for j in range(60)) for i in range(30)]
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "chat.py"), "--max-tokens", "48"],
        input="".join(f"{line}\n" for line in turns), capture_output=True, text=True, timeout=600, env=_env(),
        cwd=REPO_ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("\n> ") + out.stdout.startswith("> ") == len(turns), out.stdout[-2000:]
    assert "its oldest turn is left out" in out.stderr, out.stderr[-2000:]


def _stop_ray_started_in(temp_dir: str) -> None:
    """Kill, as ``ray stop --force`` does, the processes of the Ray cluster started with
    ``temp_dir`` and their descendants (workers rename themselves), by pid: ``ray stop`` would stop
    every Ray cluster on the machine, other test runs' included."""
    parents: dict[int, int] = {}
    doomed: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if temp_dir.encode() in cmdline:
            doomed.add(int(entry.name))
    while True:
        children = {pid for pid, ppid in parents.items() if ppid in doomed} - doomed
        if not children:
            break
        doomed |= children
    for pid in doomed - {os.getpid()}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def ray_head():
    port, dash = free_port(), free_port()
    env = _env()
    temp_dir = tempfile.mkdtemp(prefix="kvray")  # short: Ray's socket paths live under it
    subprocess.run(
        [str(BIN / "ray"), "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=true",
         f"--dashboard-port={dash}", "--dashboard-host=127.0.0.1", "--disable-usage-stats",
         f"--temp-dir={temp_dir}", f"--ray-client-server-port={free_port()}",
         f"--dashboard-agent-listen-port={free_port()}"],  # Ray's defaults: another head here may hold them
        check=True, capture_output=True, timeout=180, env=env,
    )
    try:
        yield f"127.0.0.1:{port}", f"http://127.0.0.1:{dash}"
    finally:
        # the job left kvres running: `kvres stop` removes its cold-store folder from the user's cache
        subprocess.run([str(BIN / "kvres"), "stop", "--address", f"127.0.0.1:{port}"], capture_output=True,
                       timeout=120, env=env, cwd=REPO_ROOT)
        _stop_ray_started_in(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_ray_job_submit_and_status(ray_head) -> None:
    gcs, dashboard = ray_head
    runtime_env = json.dumps({"env_vars": {"KVRES_N_CTX": "1024", "KVRES_KV_BUDGET_TOKENS": "512",
                                           "KVRES_N_THREADS": "1"}})  # the default model
    for _ in range(10):  # the head's job agent may still be starting: Ray says so, and to try again
        out = subprocess.run(
            [str(BIN / "ray"), "job", "submit", "--address", dashboard, "--runtime-env-json", runtime_env,
             "--", sys.executable, str(REPO_ROOT / "examples" / "ray_job.py")],
            capture_output=True, text=True, timeout=400, env=_env(), cwd=REPO_ROOT,
        )
        if "No available agent to submit job" not in out.stderr:
            break
        time.sleep(3)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("KVRES_JOB_RESULT "))
    result = json.loads(line.removeprefix("KVRES_JOB_RESULT "))
    assert result["resident_tokens"] <= 96 and result["token_count"] == result["prompt_tokens"] + 64
    status = subprocess.run(
        [str(BIN / "kvres"), "status", "--json", "--address", gcs, "--namespace", "kvres"],
        capture_output=True, text=True, timeout=120, env=_env(), cwd=REPO_ROOT,
    )
    assert status.returncode == 0, status.stderr[-3000:]
    report = json.loads(status.stdout)
    assert [b["backend"] for b in report["backends"]] == ["backend-0"]
    assert report["backends"][0]["kv_budget_tokens"] == 512
    assert len(report["cold_stores"]) == 1
    missing = subprocess.run(
        [str(BIN / "kvres"), "inspect", result["session"], "--address", gcs, "--namespace", "kvres"],
        capture_output=True, text=True, timeout=120, env=_env(), cwd=REPO_ROOT,
    )
    assert missing.returncode == 1 and result["session"] in missing.stderr  # the job closed it


def _demo(*args: str) -> str:
    out = subprocess.run(
        [str(BIN / "kvres"), "demo", "--prompts", "2", "--prompt-tokens", "200", "--budget", "64",
         "--threads", "1", *args],
        capture_output=True, text=True, timeout=300, env=_env(), cwd=REPO_ROOT,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "\r" not in out.stdout  # not a terminal: no progress lines
    return out.stdout


POLICIES = ("no eviction", "streaming", "SnapKV", "H2O")


def test_kvres_demo_compares_policies_and_moves_a_session() -> None:
    """`make demo` runs `kvres demo` on the passkey model; here with two short prompts."""
    out = _demo()
    assert re.search(r"^policy\s+accuracy\s+resident tokens\s+cold RAM\s+cold disk\s+time$", out, re.M)
    rows = {name: re.search(rf"^{name}\s+(\d+)/2 \(\d+%\)\s+(\d+)\s", out, re.M) for name in POLICIES}
    assert all(rows.values()), out
    assert rows["no eviction"].group(1) == "2"  # the full cache retrieves every pass key
    assert all(int(rows[name].group(2)) <= 64 for name in POLICIES[1:])
    assert "continuation identical after suspend, resume and migrate: yes" in out


def test_kvres_demo_on_any_llama_model() -> None:
    out = _demo("--model", str(shared_model_path()))
    assert re.search(r"^policy\s+same as no eviction\s+resident tokens", out, re.M)
    assert re.search(r"^no eviction\s+32/32 \(100%\)", out, re.M)
    assert "continuation identical after suspend, resume and migrate: yes" in out
