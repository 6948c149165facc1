"""Many sessions on one backend at once, on the real engines: calls of different sessions run
together (one engine batch per step), each session's greedy output is what it gets alone, the
resident budget holds at every step, and a control call does not wait for a long generation."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kvres.actors.backend_setup.engine_registry import make_executor
from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.actors.generation import GenerationRequest
from kvres.actors.host.backend import BackendHost, SessionBusyError
from kvres.actors.ray_actors.coldstore_actor import ColdStoreServer
from kvres.testing import LocalStorePort

PASSKEY = Path(__file__).resolve().parents[2] / "models" / "passkey.gguf"
ENGINES = {"llama": {"engine": "llama"}, "openvino": {"engine": "openvino", "openvino_mode": "state"}}


def _host(engine: str, tmp_path: Path, **config: object) -> BackendHost:
    options = {"n_ctx": 4096, "kv_budget_tokens": 4000, "n_seq_max": 8, "n_threads": 1,
               **ENGINES[engine], **config}
    cfg = BackendConfig(name=f"c-{engine}", model_path=PASSKEY, **options)  # type: ignore[arg-type]
    store = ColdStoreServer(64 << 20, tmp_path / "cold", 256 << 20)
    return BackendHost(cfg, make_executor(cfg, PASSKEY), store=LocalStorePort("n", {"n": store}))


def _long(n: int) -> GenerationRequest:
    """``n`` tokens, whatever the model ends its answers with (the passkey model ends them at EOS)."""
    return GenerationRequest(max_tokens=n, ignore_eos=True)


def _prompt(i: int, n: int = 120) -> list[int]:
    return [3 + (i * 31 + k * 7 + (k * k) % 11) % 120 for k in range(n)]


def _run_threads(fn, n: int) -> list[object]:
    out: list[object] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            out[i] = fn(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    return out


@pytest.mark.parametrize("engine", list(ENGINES))
def test_eight_concurrent_greedy_sessions_match_each_alone(engine: str, tmp_path: Path) -> None:
    alone = _host(engine, tmp_path / "alone")
    expected = []
    for i in range(8):
        alone.open_session(f"s{i}")
        alone.append(f"s{i}", _prompt(i))
        expected.append(alone.generate(f"s{i}", _long(24)))
        alone.close(f"s{i}")

    together = _host(engine, tmp_path / "together")
    for i in range(8):
        together.open_session(f"s{i}")

    def session(i: int) -> list[int]:
        together.append(f"s{i}", _prompt(i))
        return together.generate(f"s{i}", _long(24))

    assert _run_threads(session, 8) == expected


def test_budget_holds_at_every_step_with_16_sessions_on_8_slots(tmp_path: Path) -> None:
    """16 threads, 8 sequence slots: sessions suspended to make room come back by themselves on
    their next call; the engine never holds more than the backend budget after any step."""
    h = _host("llama", tmp_path, kv_budget_tokens=1024, n_ctx=2048)
    policy = SessionPolicy.streaming(128, recent_tokens=32)
    for i in range(16):
        h.open_session(f"s{i}", policy)

    def session(i: int) -> int:
        h.append(f"s{i}", _prompt(i, 150))
        return len(h.generate(f"s{i}", _long(40)))

    assert _run_threads(session, 16) == [40] * 16
    stats = h.stats()
    assert stats["peak_resident_tokens"] <= 1024
    assert stats["resident_tokens"] <= 1024
    for i in range(16):
        s = h.session_stats(f"s{i}")
        assert s["token_count"] == 190
        assert s["peak_resident_tokens"] <= 128  # its own budget too, at every step
    counters = [h.session_stats(f"s{i}")["counters"] for i in range(16)]
    assert sum(c["suspends"] for c in counters) > 0 and sum(c["resumes"] for c in counters) > 0


def test_control_calls_answer_between_steps_of_a_long_generation(tmp_path: Path) -> None:
    # unified: the streaming session evicts from its middle (kvres would choose split for 8 x 512)
    h = _host("llama", tmp_path, kv_budget_tokens=4000, n_ctx=4096, kv_layout="unified")
    h.open_session("long", SessionPolicy.streaming(512, recent_tokens=64))
    h.open_session("other")
    h.append("long", _prompt(0))
    h.append("other", _prompt(1))
    stream = h.stream("long", _long(4096))
    first = next(stream)  # the generation is running
    assert isinstance(first, int)
    stats = h.stats()
    h.suspend("other")
    other = h.session_stats("other")
    during = h.session_stats("long")["token_count"]
    with pytest.raises(SessionBusyError):
        h.suspend("long")
    produced = 1 + sum(1 for _ in stream)
    assert stats["sessions"]["long"]["state"] == "live" and other["state"] == "suspended"
    # the control calls were answered between steps, long before the generation ended
    assert during < 120 + 4096 // 2
    assert produced == 4096 and h.session_stats("long")["token_count"] == 120 + 4096
