"""The resident budget under a storm: 24 threads drive 24 sessions of mixed policies on a backend
of 4 sequence slots and a 320-token budget (appends, generates, streams left early, suspends,
resumes, rollbacks in random order), on the real llama.cpp engine. After every step the engine
holds at most the budget, and every session's log is exactly what it was given plus what it
received."""

from __future__ import annotations

import random
import threading
from pathlib import Path

from kvres.actors.backend_setup.engine_registry import make_executor
from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.actors.host.backend import BackendFullError, BackendHost, SessionBusyError
from kvres.actors.ray_actors.coldstore_actor import ColdStoreServer
from kvres.policy import ContextLengthError
from kvres.testing import LocalStorePort
from tests.conftest import shared_model_path

BUDGET = 320
POLICIES = [SessionPolicy(), SessionPolicy.streaming(96, recent_tokens=32),
            SessionPolicy.scored(96, recent_tokens=16), SessionPolicy.streaming(64, recent_tokens=16, spill=False)]


def test_the_budget_holds_at_every_step_and_no_log_differs(tmp_path: Path) -> None:
    model = shared_model_path()
    config = BackendConfig(name="storm", model_path=model, n_ctx=1024, n_seq_max=4, kv_budget_tokens=BUDGET,
                           n_threads=1)
    store = ColdStoreServer(16 << 20, tmp_path / "cold", 64 << 20)
    host = BackendHost(config, make_executor(config, model), store=LocalStorePort("n", {"n": store}))
    expected: dict[str, list[int]] = {}
    errors: list[BaseException] = []

    def drive(i: int) -> None:
        rng = random.Random(i)
        sid = f"s{i}"
        try:
            host.open_session(sid, POLICIES[i % len(POLICIES)])
            log: list[int] = []
            for _ in range(12):
                op = rng.choice(["append", "append", "generate", "stream", "suspend", "rollback"])
                try:
                    if op == "append" or not log:
                        tokens = [rng.randrange(3, 500) for _ in range(rng.randint(1, 60))]
                        host.append(sid, tokens)
                        log += tokens
                    elif op == "generate":
                        log += host.generate(sid, rng.randint(1, 24))
                    elif op == "stream":
                        stream = host.stream(sid, 40)
                        got = []
                        for token in stream:
                            got.append(token)
                            if len(got) == 5:
                                break
                        left = host.cancel(sid, stream.job.request_id, len(got))
                        if left is None and stream.job.error is not None:
                            assert isinstance(stream.job.error, BackendFullError), stream.job.error
                            continue  # refused after it began: the call commits nothing
                        log += list(left) if left is not None else list(stream.generation or got)
                    elif op == "suspend":
                        host.suspend(sid)
                    else:
                        k = rng.randint(0, min(10, len(log)))
                        host.truncate(sid, len(log) - k)
                        del log[len(log) - k:]
                except (BackendFullError, ContextLengthError, SessionBusyError):
                    pass  # a refusal changes nothing: the log stays as it was
            expected[sid] = log
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    stats = host.stats()
    assert stats["peak_resident_tokens"] <= BUDGET, stats["peak_resident_tokens"]
    for sid, log in expected.items():
        assert host.tokens(sid) == log, sid
