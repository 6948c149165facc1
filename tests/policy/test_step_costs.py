"""Whether a prompt shares a step: the costs learnt from steps run, and the rule that keeps the sum
of the prompts' times to first token lowest (``kvres.policy.step_costs``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvres.policy.step_costs import MIN_PROMPT_TOKENS, StepCosts
from tests.hypothesis_profiles import examples


def _cpu_like(costs: StepCosts, pass_s: float = 0.007, row_s: float = 0.0022, token_s: float = 0.001) -> StepCosts:
    for rows in (1, 8, 3, 7, 2, 8, 5):
        costs.observe(pass_s + row_s * rows, 0, rows)
    for rows, tokens in ((7, 36), (2, 100), (1, 210)):
        costs.observe(pass_s + row_s * rows + token_s * tokens, tokens, rows)
    return costs


def test_every_prompt_joins_until_both_costs_are_measured() -> None:
    costs = StepCosts()
    assert costs.fixed_s(4) is None and costs.per_token_s is None and costs.joins(5, 500, 4)
    costs.observe(0.02, 0, 4)
    assert costs.fixed_s(4) == pytest.approx(0.02) and costs.joins(5, 500, 4)  # no prompt step yet
    costs.observe(0.5, MIN_PROMPT_TOKENS - 1, 4)  # too few prompt tokens to say what one costs
    assert costs.per_token_s is None


def test_the_fixed_cost_is_a_pass_and_a_row_per_decode() -> None:
    costs = _cpu_like(StepCosts())
    assert costs.fixed_s(0) == pytest.approx(0.007, rel=1e-6)
    assert costs.fixed_s(10) == pytest.approx(0.007 + 0.022, rel=1e-6)
    assert costs.per_token_s == pytest.approx(0.001, rel=1e-6)


def test_steps_with_as_many_rows_give_their_mean() -> None:
    costs = StepCosts()
    for seconds in (0.010, 0.014, 0.012):
        costs.observe(seconds, 0, 4)
    assert 0.010 < (costs.fixed_s(4) or 0) < 0.014 and costs.fixed_s(9) == costs.fixed_s(4)


def test_on_a_cpu_a_burst_of_turns_goes_one_prompt_a_step() -> None:
    costs = _cpu_like(StepCosts())
    assert not costs.joins(1, 35, 2)  # 35 ms of prefill against a 11 ms step: the next step is sooner
    assert costs.joins(0, 35, 2)  # the step's first prompt always runs
    assert costs.joins(1, 4, 2) and costs.joins(2, 4, 2) and not costs.joins(3, 4, 2)  # short ones share


def test_on_a_gpu_like_engine_prompts_share_a_step() -> None:
    costs = _cpu_like(StepCosts(), pass_s=0.020, row_s=0.0001, token_s=0.00002)
    assert costs.joins(1, 35, 2) and costs.joins(7, 35, 2) and not costs.joins(40, 35, 2)


def test_the_costs_follow_the_load() -> None:
    costs = StepCosts(memory=8)
    for _ in range(40):
        costs.observe(0.010, 0, 4)
    for _ in range(40):
        costs.observe(0.030, 0, 4)  # the machine got busy
    assert costs.fixed_s(4) == pytest.approx(0.030, rel=0.01)


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 2.0), st.integers(0, 600), st.integers(0, 64)), max_size=40),
       st.integers(0, 16), st.integers(1, 512), st.integers(0, 64))
def test_any_steps_give_finite_costs_and_an_answer(steps: list[tuple[float, int, int]], finishing: int,
                                                   tokens: int, rows: int) -> None:
    costs = StepCosts()
    for seconds, prompt_tokens, step_rows in steps:
        costs.observe(seconds, prompt_tokens, step_rows)
    fixed = costs.fixed_s(rows)
    assert fixed is None or fixed >= 0.0
    assert costs.per_token_s is None or costs.per_token_s >= 0.0
    assert isinstance(costs.joins(finishing, tokens, rows), bool)


def test_bad_values_are_named() -> None:
    with pytest.raises(ValueError, match="memory=1 must be at least 2"):
        StepCosts(memory=1)
    with pytest.raises(ValueError, match="-1.0 s, 3 prompt tokens and 2 rows"):
        StepCosts().observe(-1.0, 3, 2)
