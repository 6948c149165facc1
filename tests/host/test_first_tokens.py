"""A turn's first token is handed out as soon as its prompt's logits are in: in llama.cpp's split
layout (a prompt and one-token decodes never share a micro-batch) before the step's decodes run,
and decoded into the log by the session's next step (``Job.pending``). The tokens are those of
a turn run alone, and a stream left while its first token is out and not yet in the log commits
exactly what it kept. Real llama.cpp on stories260K through a ``BackendHost``."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from kvres.actors.config import BackendConfig
from kvres.actors.generation import GenerationRequest
from kvres.actors.host.backend import BackendHost
from tests.conftest import local_host, shared_model_path

PROMPT = [3 + (7 * i) % 200 for i in range(40)]
TURN = [5 + (3 * i) % 150 for i in range(24)]


def _host(tmp_path: Path, layout: str = "split") -> BackendHost:
    config = BackendConfig(name=f"first-{layout}", model_path=shared_model_path(), n_ctx=1024, n_seq_max=2,
                           kv_budget_tokens=1000, n_threads=1, kv_layout=layout)
    host: BackendHost = local_host(config, tmp_path / layout)
    return host


def _passes(host: BackendHost, watched: dict[str, Any]) -> list[tuple[set[int], int]]:
    """Each ``llama_decode`` of the split layout: the sequences in it, and how many tokens the
    watched job (``watched["job"]``, once set) had handed out when it started."""
    ops = host.executor._ops  # type: ignore[attr-defined]
    inner = ops.place_many
    passes: list[tuple[set[int], int]] = []

    def spy(items):  # type: ignore[no-untyped-def]
        job = watched.get("job")
        passes.append(({seq for seq, _, _ in items}, 0 if job is None else len(job.produced)))
        return inner(items)

    ops.place_many = spy
    return passes


def test_a_turns_first_token_goes_out_before_the_steps_decodes(tmp_path: Path) -> None:
    host = _host(tmp_path)
    for sid in ("busy", "turn"):
        host.open_session(sid)
        host.append(sid, PROMPT[: 30 + len(sid)])
    watched: dict[str, Any] = {}
    passes = _passes(host, watched)
    seq_of = {sid: host.executor._sessions[sid].seq for sid in ("busy", "turn")}  # type: ignore[attr-defined]
    busy = host.stream("busy", GenerationRequest(max_tokens=40, ignore_eos=True))
    next(busy)  # "busy" is decoding: every step from here has its row
    with host._ctx.lock:  # the turn joins the next step whole
        turn = host._generate_job("turn", GenerationRequest(max_tokens=8, ignore_eos=True), 0.0, None, True, None, TURN)
        watched["job"] = turn
    replied = turn.wait_tokens()
    list(busy)
    prompt_pass = next(i for i, (seqs, _) in enumerate(passes) if seqs == {seq_of["turn"]} and passes[i][1] == 0)
    seqs, handed_out = passes[prompt_pass + 1]
    assert seqs == {seq_of["busy"]} and handed_out == 1  # the same step's decodes: its first token was already out
    assert passes[prompt_pass + 2] == ({seq_of["busy"], seq_of["turn"]}, 1)  # the next step decodes it
    alone = _host(tmp_path / "alone", "unified")
    alone.open_session("turn")
    alone.append("turn", PROMPT[:34])
    assert list(alone.generate("turn", GenerationRequest(max_tokens=8, ignore_eos=True), prompt=TURN)) == replied
    assert host.tokens("turn") == alone.tokens("turn")


@pytest.mark.parametrize("keep", [1, 0])
def test_a_stream_left_while_its_first_token_is_not_in_the_log_commits_what_it_kept(tmp_path: Path, keep: int) -> None:
    host = _host(tmp_path)
    host.open_session("s")
    host.append("s", PROMPT)
    held = threading.Event()
    engine = host._engine
    step = engine.step

    def holding(jobs):  # type: ignore[no-untyped-def]
        # while the first token is out and not in the log no step runs until the cancel came: the
        # loop waits a moment without the lock, and the cancel takes it
        if any(job.pending is not None and job.finish_reason != "cancelled" for job in jobs):
            held.set()
            return False
        return step(jobs)

    engine.step = holding  # type: ignore[method-assign]
    stream = host.stream("s", GenerationRequest(max_tokens=20, ignore_eos=True), request_id="r1", prompt=TURN)
    first = next(stream)
    assert held.wait(10)
    answer = host.cancel("s", "r1", keep)
    assert answer is not None and answer.finish_reason == "cancelled"
    assert list(answer) == [first][:keep]
    assert host.tokens("s") == PROMPT + TURN + [first][:keep]
    assert host.session_stats("s")["resident_tokens"] == len(PROMPT + TURN) + keep
    engine.step = step  # type: ignore[method-assign]
    alone = _host(tmp_path / "alone", "unified")
    alone.open_session("s")
    alone.append("s", PROMPT + TURN + [first][:keep])
    assert list(host.generate("s", 6)) == list(alone.generate("s", 6))  # the log and the KV agree
