"""The pure parts of ``benchmarks.soak``: the fault schedule, how a turn's tries are grouped and a
failure is placed against the kills, the windows and recovery of a fault, the memory trend, the
HTTP answers a client tells apart, the faults each front has, and the audit's expectation against
a real session log's text."""

from __future__ import annotations

import pytest

from benchmarks.soak.audit import AuditRow, ChatRender
from benchmarks.soak.faults import Fault, schedule
from benchmarks.soak.http_turns import Refused, TurnFailed, _error_of
from benchmarks.soak.memory import rss_trend, slope
from benchmarks.soak.report import fault_rows, in_flight_at, summarize, turns_of
from benchmarks.soak.traffic import Attempt, TrafficShape


def test_each_kind_in_turn_at_even_intervals() -> None:
    faults = schedule(("a", "b", "c"), 2, 10.0, 60.0)
    assert [f.kind for f in faults] == ["a", "b", "c", "a", "b", "c"]
    assert [f.planned_s for f in faults] == pytest.approx([10, 20, 30, 40, 50, 60])
    assert schedule(("a",), 0, 0, 10) == []
    with pytest.raises(ValueError):
        schedule(("a",), -1, 0, 10)


def test_traffic_shape_splits_clients_and_refuses_bad_sizes() -> None:
    shape = TrafficShape(clients=4, responses_clients=1, conversations_per_client=3)
    assert [shape.api_of(c) for c in range(4)] == ["chat", "chat", "chat", "responses"]
    assert shape.sessions == 12
    with pytest.raises(ValueError, match="responses_clients"):
        TrafficShape(clients=2, responses_clients=3)
    with pytest.raises(ValueError, match=">= 1"):
        TrafficShape(turns=0)


def _a(conv: str, turn: int, retry: int, start: float, end: float, outcome: str = "ok", client: int = 0,
       first: float | None = None) -> Attempt:
    return Attempt(client, conv, "chat", turn, retry, start, end, outcome, first_token=first)


def test_tries_of_a_turn_are_one_turn_timed_from_its_first_try() -> None:
    attempts = [_a("c", 0, 0, 1.0, 2.0, "failed"), _a("c", 0, 1, 3.0, 3.5, "refused"), _a("c", 0, 1, 4.0, 5.0, first=4.5),
                _a("c", 1, 0, 6.0, 7.0, first=6.2), _a("d", 0, 0, 2.0, 9.0, "failed")]
    turns = {(t.conversation, t.turn): t for t in turns_of(attempts)}
    first = turns[("c", 0)]
    assert (first.start, first.end, first.tries, first.refusals) == (1.0, 5.0, 2, 1)
    assert first.latency == pytest.approx(4.0) and first.ttft == pytest.approx(3.5)
    assert turns[("d", 0)].end is None and turns[("d", 0)].latency is None
    assert in_flight_at(attempts[0], [1.5]) and not in_flight_at(attempts[0], [2.5, 0.5])


def test_recovery_and_windows_of_a_fault() -> None:
    attempts = [_a("x", i, 0, float(i), i + 0.5, client=i % 2) for i in range(10)]  # a turn a second
    attempts += [_a("y", 0, 0, 10.0, 14.0, client=0), _a("z", 0, 0, 10.5, 16.0, client=1)]
    attempts += [_a("y", 1, 0, 16.0, 16.5, client=0), _a("z", 1, 0, 16.5, 17.0, client=1)]
    attempts += [_a("w", 0, 0, 9.8, 12.0, client=2)]  # in flight at the kill: "during", not "before"
    turns = turns_of(attempts)
    [row] = fault_rows([Fault("backend", 9.0, pid=1, at_s=10.0)], turns, window_s=5.0)
    assert row["recover_s"] == pytest.approx(4.0) and row["all_clients_s"] == pytest.approx(6.0)
    assert row["before"]["turns"] == 5 and row["before"]["latency_p50_s"] == pytest.approx(0.5)
    assert row["during"]["turns"] == 3 and row["after"]["turns"] == 2
    unmade = fault_rows([Fault("proxy", 1.0)], turns, 5.0)
    assert unmade == []


def test_the_summary_says_which_invariant_broke() -> None:
    attempts = [_a("c", 0, 0, 0.0, 1.0), _a("c", 1, 0, 2.0, 3.0, "failed"), _a("c", 1, 1, 4.0, 5.0),
                _a("d", 0, 0, 6.0, 7.0, "failed", client=1), _a("d", 0, 1, 8.0, 9.0, "failed", client=1),
                _a("d", 0, 2, 9.5, 10.0, client=1)]
    faults = [Fault("backend", 2.0, pid=1, at_s=2.5)]
    audits = [AuditRow("c", "chat", "c", 2, False, same_text=True, expected_tokens=10, log_tokens=10),
              AuditRow("d", "chat", "d", 1, False, same_text=False, expected_tokens=10, log_tokens=12)]
    rss = rss_trend([(0.0, 1, "gcs_server", 100 << 20), (60.0, 1, "gcs_server", 120 << 20)], 0.0)
    result = summarize(attempts, audits, faults, rss, {"window_s": 5.0}, 10.0)
    assert result["failed_tries"] == 3 and result["failed_in_flight_at_a_kill"] == 1
    assert result["failed_not_at_a_kill"] == 2 and result["retries_failed"] == 1
    assert result["turns_completed_by_the_retry"] == 1
    assert result["audit"]["tokens_duplicated"] == 2 and result["audit"]["mismatched"] == 1
    inv = result["invariants"]
    assert inv["every_fault_made"] and inv["no_session_lost"] and inv["every_fault_recovered"]
    assert not inv["no_token_lost_or_duplicated"] and not inv["only_turns_in_flight_at_a_kill_failed"]
    assert not inv["every_retry_succeeded"]
    assert not result["bars"]["no_process_grew_more_than_10_pct_after_warmup"]  # +20% in gcs_server


def test_a_run_without_faults_is_held_to_no_429_and_flat_memory() -> None:
    attempts = [_a("c", 0, 0, 0.0, 1.0), _a("c", 1, 0, 2.0, 3.0)]
    audits = [AuditRow("c", "chat", "c", 2, False, same_text=True, expected_tokens=10, log_tokens=10)]
    flat = rss_trend([(0.0, 1, "gcs_server", 100 << 20), (600.0, 1, "gcs_server", 105 << 20)], 0.0)  # 0.5 MiB/min
    result = summarize(attempts, audits, [], flat, {"window_s": 5.0}, 600.0)
    assert result["bars"] == {**result["invariants"], "every_fault_recovered_within_30_s": True,
                              "no_process_grew_more_than_10_pct_after_warmup": True,
                              "no_429_without_faults": True, "memory_grew_under_1_mib_per_min": True}
    refused = [*attempts, _a("c", 2, 0, 4.0, 4.1, "refused")]
    refused[-1].status, refused[-1].code = 429, "backend_full"
    growing = rss_trend([(0.0, 1, "gcs_server", 100 << 20), (60.0, 1, "gcs_server", 102 << 20)], 0.0)  # 2 MiB/min
    bars = summarize(refused, audits, [], growing, {"window_s": 5.0}, 600.0)["bars"]
    assert not bars["no_429_without_faults"] and not bars["memory_grew_under_1_mib_per_min"]


def test_memory_trend_after_warmup_per_kind_and_per_process() -> None:
    assert slope([(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]) == pytest.approx(2.0)
    assert slope([(0.0, 1.0)]) == 0.0
    mib = 1 << 20
    samples = [(t, 10, "raylet", (100 + t) * mib) for t in (0.0, 60.0, 120.0, 180.0)]
    samples += [(t, 11, "ray::BackendServer", 200 * mib) for t in (0.0, 60.0)]
    samples += [(t, 12, "ray::BackendServer", 50 * mib) for t in (120.0, 180.0)]  # killed, restarted
    trend = rss_trend(samples, warmup_s=60.0)
    raylet = trend["labels"]["raylet"]
    assert raylet["first_mib"] == 160 and raylet["last_mib"] == 280 and raylet["slope_mib_per_min"] == pytest.approx(60)
    assert trend["labels"]["ray::BackendServer"]["processes"] == 2
    assert list(trend["steady"]) == ["raylet (10)"]  # the restarted backend lived through no whole span
    assert trend["total"]["first_mib"] == 360 and trend["total"]["last_mib"] == 330
    assert rss_trend(samples, warmup_s=1000.0)["total"] is None


def test_refusals_are_told_from_failures() -> None:
    busy = _error_of(409, b'{"error": {"code": "session_busy", "message": "m"}}')
    full = _error_of(429, b'{"error": {"code": "backend_full", "message": "m"}}')
    assert isinstance(busy, Refused) and isinstance(full, Refused) and full.status == 429
    for status, body in ((503, b'{"error": {"code": "unavailable"}}'), (500, b"Internal Server Error"),
                         (409, b'{"error": {"code": "session_exists"}}')):
        error = _error_of(status, body)
        assert isinstance(error, TurnFailed) and error.status == status


def test_expected_log_is_the_rendering_then_the_reply_and_its_eos() -> None:
    from kvres.actors.chat_source import read_chat_template
    from kvres.actors.default_model import default_model_path

    model = default_model_path()
    render = ChatRender(model)
    source = read_chat_template(model)
    assert source is not None
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "and"}, {"role": "assistant", "content": "so on"}]
    stopped = render.expected(messages, "stop")
    assert stopped.endswith("<|assistant|>\nso on" + source.eos_token)
    assert stopped.startswith("<|user|>\nhi" + source.eos_token) and "hello" + source.eos_token in stopped
    assert render.expected(messages, "length") == stopped.removesuffix(source.eos_token)
    bos = source.bos_token
    assert render.log_text([source.bos_id, 5], bos + "x") == "x" and render.log_text([5], bos + "x") == bos + "x"


def test_a_rerendered_turn_is_a_cache_miss_and_a_given_up_one_may_hold_its_tries() -> None:
    """A turn whose server said its rendering left the log (a prefix break) lost nothing; one that
    found the log short did. A conversation given up mid-turn passes its audit when its log starts
    with what was sent and received (its last tries may have left more), not when it is short."""
    rewound, rerendered = _a("c", 1, 0, 2.0, 3.0), _a("d", 1, 0, 2.0, 3.0, client=1)
    rewound.rewound, rerendered.rerendered = 4, 4
    audits = [AuditRow("c", "chat", "c", 2, False, same_text=True, expected_tokens=10, log_tokens=10),
              AuditRow("d", "chat", "d", 2, True, same_text=True, expected_tokens=10, log_tokens=14),
              AuditRow("e", "chat", "e", 2, True, same_text=True, expected_tokens=10, log_tokens=9)]
    rss = rss_trend([(0.0, 1, "gcs_server", 100 << 20), (60.0, 1, "gcs_server", 100 << 20)], 0.0)
    audit = summarize([rewound, rerendered], audits, [], rss, {"window_s": 5.0}, 10.0)["audit"]
    assert audit["turns_that_found_tokens_missing"] == 1 and audit["turns_rerendered"] == 1
    assert audit["tokens_rerendered"] == 4 and audit["mismatched"] == 1  # e: given up, and short
    assert audit["tokens_lost"] == 4 + 1


def test_the_faults_are_those_of_the_front_served() -> None:
    from benchmarks.soak.__main__ import build_parser, settings_of

    local = settings_of(build_parser().parse_args(["--front", "local"]))
    assert local["front"] == "local" and local["faults"] == ("backend", "coldstore", "planner", "state")
    direct = settings_of(build_parser().parse_args(["--front", "direct"]))
    assert direct["faults"] == ("backend", "coldstore", "planner", "replica", "state", "proxy")
    with pytest.raises(SystemExit, match=r"\['replica'\] are not the local front's"):
        settings_of(build_parser().parse_args(["--front", "local", "--faults", "backend,replica"]))
