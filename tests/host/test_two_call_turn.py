"""The natural two-call turn (``append`` then ``generate`` or ``stream``) costs the engine no more
than one call doing both (``generate(..., prompt=)``): on the real llama.cpp engine (stories260K),
in both KV layouts, the steps (``LoopProfile.steps``) differ by at most one and the decoded tokens
not at all. The generate's first token is sampled from the logits the append left (no step of its
own for the append's last token, none to feed it again) and the append's prompt is not a batch of
its own beyond its one step."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvres.actors.config import BackendConfig
from kvres.actors.generation import GenerationRequest
from kvres.actors.host.backend import BackendHost
from tests.conftest import local_host, shared_model_path

HISTORY = [3 + (7 * i) % 200 for i in range(40)]
TURN = [5 + (11 * i) % 190 for i in range(32)]


@pytest.fixture(params=["unified", "split"])
def host(request: pytest.FixtureRequest, tmp_path: Path) -> BackendHost:
    config = BackendConfig(name=f"turns-{request.param}", model_path=shared_model_path(), n_ctx=2048, n_seq_max=4,
                           kv_budget_tokens=2000, n_threads=1, kv_layout=request.param)
    return local_host(config, tmp_path / "cold")


def _cost(host: BackendHost, session_id: str, turn: object) -> tuple[int, int, list[int]]:
    """(steps, decoded tokens, the session's log) of one turn on a session holding HISTORY."""
    host.open_session(session_id)
    host.append(session_id, HISTORY)
    before = host.stats()["loop"]
    turn(session_id)  # type: ignore[operator]
    after = host.stats()["loop"]
    log = host.tokens(session_id)
    host.close(session_id)
    return after["steps"] - before["steps"], after["engine_tokens"] - before["engine_tokens"], log


@pytest.mark.parametrize("max_tokens", [1, 4])
def test_append_then_generate_costs_at_most_one_step_more_than_one_call(host: BackendHost, max_tokens: int) -> None:
    request = GenerationRequest(max_tokens=max_tokens, ignore_eos=True)
    one = _cost(host, "one", lambda sid: host.generate(sid, request, prompt=TURN))
    two = _cost(host, "two", lambda sid: (host.append(sid, TURN), host.generate(sid, request)))
    streamed = _cost(host, "streamed", lambda sid: (host.append(sid, TURN), list(host.stream(sid, request))))
    assert one[2] == two[2] == streamed[2]  # the same turn
    assert one[1] == two[1] == streamed[1] == len(TURN) + max_tokens  # every token decoded once
    assert one[0] == 1 + max_tokens  # the prompt's step (its first token from its logits), then one a token
    assert two[0] <= one[0] + 1 and streamed[0] <= one[0] + 1
