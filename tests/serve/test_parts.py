"""The HTTP front's parts on their own (no server): API keys, session holds, stored responses, metrics,
streamed text, error mapping, request validation, route labels, the model catalog, the CLI's
refusals."""

from __future__ import annotations

import pydantic
import pytest

from kvres.actors.config import BackendConfig
from kvres.actors.host.refusals import BackendFullError, SessionBusyError
from kvres.cluster.cli import main
from kvres.cluster.serve.auth import (
    AuthConfigError,
    KeyCheck,
    bind_host,
    key_digests,
    load_key_entries,
    load_keys,
)
from kvres.cluster.serve.catalog import ModelCatalog
from kvres.cluster.serve.http_errors import ApiError, SessionLockedError, api_error
from kvres.cluster.serve.http_glue import parse, route_label
from kvres.cluster.serve.metrics import (
    TOKEN_GAP_BUCKETS,
    Histogram,
    ReplicaMetrics,
    RequestSample,
    ServeMetrics,
)
from kvres.cluster.serve.openai_schemas import ChatCompletionRequest
from kvres.cluster.serve.owners import Owner, SessionOwners, may_use
from kvres.cluster.serve.records import ResponseRecord, ResponseRecords
from kvres.cluster.serve.responses_schemas import ResponseRequest
from kvres.cluster.serve.text_deltas import TextDeltas
from kvres.coldstore.errors import InvalidSessionIdError
from kvres.policy import SessionExistsError, UnknownSessionError
from kvres.policy.errors import BackendLostError, CapabilityError

KEY = "k" * 20


def test_keys_from_the_environment_or_a_file(tmp_path) -> None:
    assert load_keys(env={"KVRES_API_KEYS": f"{KEY}, {KEY}2"}) == [KEY, f"{KEY}2"]
    f = tmp_path / "keys"
    f.write_text(f"# ops\n{KEY}3\n\n")
    assert load_keys(env={"KVRES_API_KEY_FILE": str(f)}) == [f"{KEY}3"]
    assert load_keys(str(f), env={"KVRES_API_KEYS": KEY}) == [f"{KEY}3"]  # the file given wins
    assert load_keys(env={}) == []
    with pytest.raises(AuthConfigError, match="at least 16"):
        load_keys(env={"KVRES_API_KEYS": "short"})
    with pytest.raises(AuthConfigError, match="cannot be read"):
        load_keys(str(tmp_path / "missing"))


def test_key_check_compares_digests() -> None:
    check = KeyCheck(key_digests([KEY, f"{KEY}2"]))
    assert check.allows(f"Bearer {KEY}") and check.allows(f"bearer {KEY}2") and check.allows(None, KEY)
    assert not check.allows("Bearer wrong") and not check.allows(None) and not check.allows(KEY)
    assert KeyCheck(()).open and KeyCheck(()).allows(None)


def test_a_key_may_name_its_tenant(tmp_path) -> None:
    env = {"KVRES_API_KEYS": f"{KEY} tenant=acme, {KEY}2,{KEY}3 tenant=beta.eu"}
    assert load_key_entries(env=env) == [(KEY, "acme"), (f"{KEY}2", None), (f"{KEY}3", "beta.eu")]
    assert load_keys(env=env) == [KEY, f"{KEY}2", f"{KEY}3"]
    f = tmp_path / "keys"
    f.write_text(f"{KEY}4 tenant=ops  # the operators\n{KEY}5\n")
    assert load_key_entries(str(f)) == [(f"{KEY}4", "ops"), (f"{KEY}5", None)]
    check = KeyCheck(key_digests(load_key_entries(env=env)))
    assert check.match(f"Bearer {KEY}") == (True, "acme") and check.match(None, f"{KEY}3") == (True, "beta.eu")
    assert check.match(f"Bearer {KEY}2") == (True, None) and check.match("Bearer wrong") == (False, None)
    assert KeyCheck(()).match(None) == (True, None)
    with pytest.raises(AuthConfigError, match="follows no key"):
        load_key_entries(env={"KVRES_API_KEYS": "tenant=acme"})
    with pytest.raises(AuthConfigError, match="follows no key"):
        load_key_entries(env={"KVRES_API_KEYS": f"{KEY} tenant=a tenant=b"})
    with pytest.raises(AuthConfigError, match="tenant label 'b!' must match"):
        load_key_entries(env={"KVRES_API_KEYS": f"{KEY} tenant=b!"})


def test_without_a_key_only_loopback(caplog) -> None:
    assert bind_host("0.0.0.0", have_keys=True) == "0.0.0.0"
    with caplog.at_level("WARNING", logger="kvres.serve"):
        assert bind_host("0.0.0.0", have_keys=False) == "127.0.0.1"
    assert "no API key" in caplog.text and "0.0.0.0" in caplog.text


def test_holds_one_holder_expiry_renew_release() -> None:
    from kvres.actors.host.holds import Hold, SessionHolds

    now = [0.0]
    holds = SessionHolds(clock=lambda: now[0])
    assert holds.acquire("s", "a", 10) and not holds.acquire("s", "b", 10) and holds.acquire("s", "a", 10)
    now[0] = 8.0
    holds.renew({"s": "a"}, 10)
    now[0] = 15.0
    assert not holds.acquire("s", "b", 10)  # renewed until 18
    holds.release("s", "b")  # not b's
    assert holds.holder("s") == "a"
    now[0] = 18.5
    assert holds.acquire("s", "b", 10)  # a's expired
    holds.release("s", "b")
    assert holds.holder("s") is None
    with pytest.raises(ValueError, match="ttl_s"):
        Hold("h", 0)


def test_session_owners_a_bounded_cache_and_the_fence_rule() -> None:
    owners = SessionOwners(max_entries=2)
    assert owners.get("a") == Owner(known=False)
    owners.set("a", "acme")
    owners.set("b", None)
    assert owners.get("a") == Owner(known=True, tenant="acme")  # used: "b" is now the oldest
    owners.set("c", "zeta")
    assert owners.get("b").known is False and owners.get("a").known and len(owners) == 2
    owners.drop("a")
    assert owners.get("a").known is False
    assert may_use("acme", "acme") and may_use(None, None)
    assert not may_use("acme", None) and not may_use(None, "acme") and not may_use("acme", "zeta")
    with pytest.raises(ValueError, match="max_entries"):
        SessionOwners(max_entries=0)


def test_a_session_the_front_does_not_know_is_fenced_by_its_policys_tenant() -> None:
    """A session a driver opened (or one the front's state forgot): its tenant is read once from its
    policy on the backend, remembered, and the rule applied; without keys nothing is fenced."""
    from types import SimpleNamespace

    from kvres.cluster.serve.service import OtherTenantsSessionError, Service

    owners, stats_calls = SessionOwners(), []

    class Handle:
        def __init__(self, sid: str) -> None:
            self.session_id = sid

        def stats(self) -> dict[str, object]:
            stats_calls.append(self.session_id)
            return {"policy": {"tenant": {"drv-acme": "acme"}.get(self.session_id)}}

    def session(sid: str) -> Handle:
        if sid == "gone":
            raise UnknownSessionError(sid)
        return Handle(sid)

    service = object.__new__(Service)
    service.manager = SimpleNamespace(session=session)
    service.state = SimpleNamespace(owner=owners.get, claim=owners.set)
    service.keys = KeyCheck(key_digests([KEY]))
    assert service.session("drv-acme", "acme").session_id == "drv-acme" and stats_calls == ["drv-acme"]
    assert owners.get("drv-acme") == Owner(known=True, tenant="acme")
    with pytest.raises(OtherTenantsSessionError, match="unknown session id 'drv-acme'"):
        service.session("drv-acme", None)
    assert stats_calls == ["drv-acme"]  # the second time from what the front remembered
    with pytest.raises(OtherTenantsSessionError):
        service.session("drv-none", "acme")
    assert service.session("drv-none", None).session_id == "drv-none"
    owners.set("drv-acme", "zeta")  # what a lease said of the owner wins over a second lookup
    with pytest.raises(OtherTenantsSessionError):
        service.session("drv-acme", "acme", Owner(known=True, tenant="zeta"))
    with pytest.raises(UnknownSessionError):
        service.session("gone", "acme")
    service.keys = KeyCheck(())  # no keys: no identity, no fence
    assert service.session("drv-acme", "anyone").session_id == "drv-acme"


def test_records_count_sessions_and_persist() -> None:
    written: dict[str, str | None] = {}
    records = ResponseRecords(max_records=3, persist=lambda k, v: written.__setitem__(k, v))

    def rec(rid: str, sid: str, t: float) -> ResponseRecord:
        return ResponseRecord(rid, sid, 10, [{"role": "user", "content": rid}], created_at=t)

    assert records.put(rec("r1", "s1", 1)) == [] and records.put(rec("r2", "s1", 2)) == []
    assert records.delete("r1") == (rec("r1", "s1", 1), None)  # s1 is still named by r2
    assert records.put(rec("r3", "s2", 3)) == [] and records.put(rec("r4", "s3", 4)) == []
    assert records.put(rec("r5", "s3", 5)) == ["s1"]  # r2 made room: s1 is named by none
    assert written["r2"] is None and ResponseRecord.from_json(written["r5"]).session_id == "s3"
    assert records.forget_session("s3") == ["r4", "r5"] and records.ids() == ["r3"]
    again = ResponseRecords()
    again.load([ResponseRecord.from_json(v) for v in written.values() if v])
    assert again.ids() == ["r3"]  # what was written: the forgotten ones deleted


def test_metrics_render_per_route() -> None:
    m = ServeMetrics()
    m.enter("r1", "/v1/chat/completions")
    m.enter("r2", "/v1/chat/completions")
    gaps = Histogram(TOKEN_GAP_BUCKETS)
    for g in (0.002, 0.004, 0.2):
        gaps.observe(g)
    m.leave("r1", "/v1/chat/completions")
    m.record(RequestSample("/v1/chat/completions", 200, 0.5, ttft_s=0.05, gaps=gaps.state(), prompt_tokens=30,
                           cached_tokens=20, completion_tokens=3, session_id="s"))
    text = m.render()
    assert 'kvres_serve_requests_total{route="/v1/chat/completions",status="200"} 1' in text
    assert 'kvres_serve_time_to_first_token_seconds_bucket{route="/v1/chat/completions",le="0.05"} 1' in text
    assert 'kvres_serve_inter_token_latency_seconds_count{route="/v1/chat/completions"} 3' in text
    assert 'kvres_serve_queue_depth{route="/v1/chat/completions"} 1' in text
    assert 'kvres_serve_tokens_total{route="/v1/chat/completions",kind="cached"} 20' in text
    assert m.session_counters("s") == {"turns": 1, "prefilled_tokens": 10, "cached_tokens": 20, "completion_tokens": 3}


def test_a_replica_aggregates_its_requests_and_sends_them_once_per_flush() -> None:
    """No call per request: what a replica's requests made is sent when none is left in flight (or
    at most every flush_every_s, or when the figures are read), and merged it reads as if recorded
    one by one in the shared metrics."""
    sent: list[tuple[ServeMetrics, dict[str, int]]] = []
    replica = ReplicaMetrics(lambda delta, in_flight: sent.append((delta, in_flight)), flush_every_s=3600)
    samples = [RequestSample("/v1/chat/completions", 200, 0.5, ttft_s=0.05, prompt_tokens=30, cached_tokens=20,
                             completion_tokens=3, session_id="s"),
               RequestSample("/v1/chat/completions", 200, 0.7, ttft_s=0.2, prompt_tokens=9, completion_tokens=2,
                             session_id="s", prefix_breaks=1),
               RequestSample("/v1/models", 200, 0.01)]
    for route in ("/v1/chat/completions", "/v1/chat/completions", "/v1/models"):
        replica.enter(route)
    replica.record(samples[0])
    replica.record(samples[2])
    assert sent == []  # a request is still in flight, and the flush is not due
    shared = ServeMetrics()
    shared.enter("other", "/v1/models")
    replica.flush()  # the figures are read: what the replica has goes first
    assert len(sent) == 1 and sent[0][1] == {"/v1/chat/completions": 1, "/v1/models": 0}
    shared.merge("r", *sent[0])
    assert shared.queue_depth() == {"/v1/chat/completions": 1, "/v1/models": 1}
    replica.record(samples[1])  # the last in flight: sent at once
    assert len(sent) == 2
    shared.merge("r", *sent[1])
    replica.flush()
    assert len(sent) == 2  # nothing new: nothing sent
    one_by_one = ServeMetrics()
    one_by_one.enter("other", "/v1/models")
    for sample in samples:  # as the actor counted each request before (a call at its start, one at its end)
        one_by_one.enter("r", sample.route)
        one_by_one.leave("r", sample.route)
        one_by_one.record(sample)
    assert shared.render() == one_by_one.render()
    assert 'kvres_serve_prefix_breaks_total{route="/v1/chat/completions"} 1' in shared.render()
    assert shared.session_counters("s") == {"turns": 2, "prefilled_tokens": 19, "cached_tokens": 20,
                                            "completion_tokens": 5}


def test_text_deltas_hold_back_stop_prefixes_and_broken_characters() -> None:
    pieces = {1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "\xe2", 6: "\x82\xac"}

    def detok(tokens) -> str:
        return b"".join(pieces[t].encode("latin-1") for t in tokens).decode("utf-8", "replace")

    d = TextDeltas(detok, stop=["world"])
    assert [d.push(t) for t in (1, 2, 3)] == ["Hel", "lo", " "]  # "wor" may begin "world": held back
    assert d.sent == "Hello " and d.covered == 2
    assert d.push(4) == ""  # "world" completed: cut before it
    assert d.finish("Hello ") == "" and d.sent == "Hello "
    e = TextDeltas(detok)
    assert e.push(5) == "" and e.push(6) == "€" and e.covered == 2


def test_errors_map_to_statuses() -> None:
    cases = {UnknownSessionError("s"): 404, SessionExistsError("s"): 409, SessionBusyError("busy"): 409,
             SessionLockedError("locked"): 409, BackendFullError("full"): 429, BackendLostError("lost"): 503,
             CapabilityError("no"): 400, InvalidSessionIdError("bad"): 400, ValueError("v"): 400,
             RuntimeError("bug"): 500, ApiError(418, "tea"): 418}
    for exc, status in cases.items():
        assert api_error(exc).status == status, exc
    body = api_error(UnknownSessionError("s")).body()["error"]
    assert body["code"] == "session_not_found" and "'s'" in body["message"]


def test_requests_are_validated_naming_the_field() -> None:
    with pytest.raises(ApiError) as err:
        parse(ChatCompletionRequest, b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": 2}')
    assert err.value.status == 400 and err.value.param == "top_p"
    with pytest.raises(ApiError, match="JSON"):
        parse(ChatCompletionRequest, b"{")
    req = parse(ChatCompletionRequest, b'{"model": "m", "messages": [{"role": "developer", "content": '
                                       b'[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], "seed": -1}')
    assert req.messages_for_template() == [{"role": "system", "content": "ab"}]
    plan = req.plan(8)
    assert plan.seed == 2**32 - 2 and plan.temperature == 1.0 and plan.request.max_tokens == 8
    r = ResponseRequest.model_validate({"model": "m", "input": "hi", "text": {"format": {
        "type": "json_schema", "name": "x", "schema": {"type": "object"}}}})
    assert r.json_schema() == {"type": "object"} and r.input_items()[0].as_message() == {"role": "user",
                                                                                          "content": "hi"}
    with pytest.raises(pydantic.ValidationError, match="background"):
        ResponseRequest.model_validate({"model": "m", "input": "hi", "background": True})


def test_route_labels_are_a_bounded_set() -> None:
    assert route_label("/v1/chat/completions") == "/v1/chat/completions"
    assert route_label("/v1/responses/resp_1/input_items") == "/v1/responses/{id}/input_items"
    assert route_label("/v1/sessions/abc/fork") == "/v1/sessions/{id}/fork"
    assert route_label("/v1/sessions/abc") == "/v1/sessions/{id}"
    assert route_label("/health") == "/health" and route_label("/x/y") == "other"


def test_catalog_ids_and_backends(tmp_path) -> None:
    a, b = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf"
    for p in (a, b):
        p.parent.mkdir()
        p.write_bytes(b"GGUF")
    configs = [BackendConfig(name="x", model_path=a, kv_layout="unified"),
               BackendConfig(name="y", model_path=a, n_ctx=1024, kv_budget_tokens=1000),
               BackendConfig(name="z", model_path=b, kv_layout="unified")]
    catalog = ModelCatalog(configs, keeps_every_token=False)
    assert [(m.id, m.backends, m.n_ctx) for m in catalog.models] == [("m", ["x", "y"], 1024), ("b-m", ["z"], 4096)]
    # what one session holds where its policy keeps every token: the KV budget, a split stream
    split = BackendConfig(name="w", model_path=b, n_ctx=4096, n_seq_max=8, kv_budget_tokens=4000, kv_layout="split")
    assert [m.n_ctx for m in ModelCatalog([*configs, split]).models] == [1000, 512]
    assert [m.n_ctx for m in ModelCatalog([*configs, split], keeps_every_token=False).models] == [1024, 512]
    assert catalog.resolve("m")[1] is None and catalog.resolve("z") == (catalog.models[1], "z")
    with pytest.raises(ApiError) as err:
        catalog.resolve("other")
    assert err.value.status == 404 and err.value.param == "model"


def test_serve_command_refuses_before_starting_anything(capsys, monkeypatch) -> None:
    assert main(["serve", "--detach"]) == 1
    assert "--detach needs a standing cluster" in capsys.readouterr().err
    assert main(["serve", "--port", "0"]) == 1
    monkeypatch.setenv("KVRES_SERVE_FRONT", "fast")
    assert main(["serve"]) == 1
    assert "KVRES_SERVE_FRONT must be one of local, direct, serve, got 'fast'" in capsys.readouterr().err


def test_the_front_by_default_is_the_one_inside_the_backends(monkeypatch) -> None:
    from kvres.cluster.serve.launch import default_front

    monkeypatch.delenv("KVRES_SERVE_FRONT", raising=False)
    assert default_front() == "local"
    monkeypatch.setenv("KVRES_SERVE_FRONT", "direct")
    assert default_front() == "direct"


def test_the_serve_config_builder(monkeypatch) -> None:
    from ray.serve import Application

    from kvres.cluster.serve.app import build_app

    monkeypatch.setenv("KVRES_API_KEYS", KEY)
    assert isinstance(build_app({"namespace": "ns", "max_replicas": 3}), Application)
    with pytest.raises(ValueError, match="unknown kvres serve arguments"):
        build_app({"replicas": 2})
    with pytest.raises(ValueError, match="min_replicas"):
        build_app({"min_replicas": 3, "max_replicas": 2})


def test_the_local_vocabulary_decodes_as_the_backend_does(stories_model) -> None:
    from kvres.actors.engines.llama.engine import LlamaModel
    from kvres.cluster.serve.vocab import local_vocab

    engine = LlamaModel(stories_model)
    vocab = local_vocab(str(stories_model))
    assert vocab is not None and vocab.n_vocab == engine.n_vocab
    ids = engine.tokenize("Once upon a time, a little cat saw the sun.", add_bos=True)
    for tokens in (ids, ids[1:], ids[3:], [ids[0]], list(range(250, 300))):
        for special in (False, True):
            assert vocab.detokenize(tokens, special) == engine.detokenize(tokens, special)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        vocab.detokenize([vocab.n_vocab])
    assert local_vocab("/no/such/model.gguf") is None


def test_session_lifetime_from_options_and_headers() -> None:
    from kvres.cluster.serve.lifetime import MAX_LIFETIME_S, SessionLifetime, lifetime_of, seconds_option

    assert seconds_option("0") is None and seconds_option("2.5") == 2.5
    for text in ("-1", "nan", "inf", "soon"):
        with pytest.raises(ValueError, match=repr(text)):
            seconds_option(text)
    defaults = SessionLifetime(idle_s=300, ttl_s=None)
    assert lifetime_of(defaults, {}) == defaults
    asked = lifetime_of(defaults, {"x-session-ttl": "60", "x-session-idle": " 5 "})
    assert asked.policy_fields() == {"idle_suspend_s": 5.0, "ttl_s": 60.0}
    assert lifetime_of(defaults, {"x-session-ttl": str(MAX_LIFETIME_S)}).ttl_s == MAX_LIFETIME_S
    for value in ("0", "-3", "nan", str(MAX_LIFETIME_S + 1), ""):
        with pytest.raises(ApiError) as err:
            lifetime_of(defaults, {"x-session-ttl": value})
        assert err.value.status == 400 and err.value.param == "X-Session-TTL" and repr(value) in err.value.message
    with pytest.raises(ValueError, match="idle_s"):
        SessionLifetime(idle_s=0)
    assert "never parked" in SessionLifetime(idle_s=None).describe()


def test_a_busy_session_is_a_409_with_retry_after() -> None:
    err = api_error(SessionLockedError("locked"))
    assert (err.status, err.code, err.headers) == (409, "session_busy", {"Retry-After": "1"})
    assert api_error(SessionBusyError("busy")).headers == {"Retry-After": "1"}


def test_session_counters_are_kept_for_the_sessions_used_last() -> None:
    m = ServeMetrics(max_sessions=2)
    for sid in ("a", "b", "a", "c"):  # c comes third: b, the one unused longest, goes
        m.record(RequestSample("/v1/chat/completions", 200, 0.1, prompt_tokens=5, session_id=sid))
    assert list(m.sessions) == ["a", "c"]
    assert m.session_counters("a")["turns"] == 2 and m.session_counters("b")["turns"] == 0
    merged = ServeMetrics(max_sessions=2)
    merged.merge("r", m, {})
    merged.merge("r", ServeMetrics(sessions={"d": m.session_counters("a")}), {})  # merged ones count as used too
    assert list(merged.sessions) == ["c", "d"]
