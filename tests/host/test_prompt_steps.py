"""Where prompts arrive together, each shares a step with the others only when its own prefill costs
them less than the next step would cost it (``kvres.policy.step_costs``); decodes never wait, and
every turn gets what it gets alone. Real llama.cpp on stories260K through a ``BackendHost``; the
step costs are fixed here (CPU-like: a prompt token costs much more than a step's pass), so the
grouping does not depend on this machine's speed."""

from __future__ import annotations

from pathlib import Path

from kvres.actors.config import BackendConfig
from kvres.actors.host.backend import BackendHost
from kvres.policy.step_costs import StepCosts
from tests.conftest import local_host, shared_model_path

PROMPTS = {f"s{i}": [3 + (11 * i + 7 * k) % 200 for k in range(30 + 5 * i)] for i in range(3)}


class _Fixed(StepCosts):
    """Costs as measured once, not moved by this machine's steps."""

    def __init__(self, pass_s: float, row_s: float, token_s: float) -> None:
        super().__init__()
        for rows in (1, 4):
            super().observe(pass_s + row_s * rows, 0, rows)
        super().observe(pass_s + row_s + token_s * 100, 100, 1)

    def observe(self, seconds: float, prompt_tokens: int, rows: int) -> None:
        return None


def _host(tmp_path: Path, costs: StepCosts | None) -> tuple[BackendHost, list[list[int]]]:
    config = BackendConfig(model_path=shared_model_path(), n_ctx=1024, n_seq_max=4, kv_budget_tokens=1000,
                           n_threads=1)
    host: BackendHost = local_host(config, None)
    if costs is not None:
        host._engine.costs = costs
    steps: list[list[int]] = []
    inner = host.executor.append_many_first

    def spy(first, rest, between):  # the token count of each item of each engine step
        steps.append([len(tokens) for _, tokens in [*first, *rest]])
        return inner(first, rest, between)

    host.executor.append_many_first = spy  # type: ignore[method-assign]
    return host, steps


def _burst(host: BackendHost) -> dict[str, list[int]]:
    """The three turns submitted under the backend's lock, so they meet in one step's job list."""
    for sid in PROMPTS:
        host.open_session(sid)
    with host._ctx.lock:
        jobs = {sid: host._generate_job(sid, 8, 0.0, None, False, None, prompt) for sid, prompt in PROMPTS.items()}
    return {sid: list(job.wait_tokens()) for sid, job in jobs.items()}


def test_on_a_cpu_a_burst_of_turns_goes_one_prompt_a_step(tmp_path: Path) -> None:
    host, steps = _host(tmp_path, _Fixed(pass_s=0.007, row_s=0.002, token_s=0.001))
    replies = _burst(host)
    prompt_steps = [s for s in steps if any(n > 1 for n in s)]
    assert [sum(1 for n in s if n > 1) for s in prompt_steps] == [1, 1, 1]  # one prompt a step
    assert any(1 in s for s in prompt_steps[1:])  # the first turn's decodes went on beside the later prompts
    alone, _ = _host(tmp_path, None)
    for sid, prompt in PROMPTS.items():
        alone.open_session(sid)
        assert list(alone.generate(sid, 8, prompt=prompt)) == replies[sid]


def test_where_a_pass_costs_more_than_the_prompts_they_share_a_step(tmp_path: Path) -> None:
    host, steps = _host(tmp_path, _Fixed(pass_s=0.020, row_s=0.0001, token_s=0.00001))
    _burst(host)
    assert any(sum(1 for n in s if n > 1) == 3 for s in steps)  # all three prompts in one step

