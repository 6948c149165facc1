"""Per-tenant quotas on the real llama.cpp engine (stories260K): a tenant over its resident
quota makes room among its own sessions, a call that cannot fit is refused and commits nothing,
the cold quota drops the tenant's spilled blocks first and then its oldest parked states (which
resume by recomputing their logs, to the same continuation), and bad labels and quotas are named."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from kvres.actors.config import BackendConfig, SessionPolicy, TenantQuota
from kvres.actors.host.backend import BackendHost
from kvres.actors.host.refusals import TenantQuotaError
from tests.conftest import local_host, shared_model_path

PROMPT = [3 + (7 * i) % 200 for i in range(40)]
LONG = [5 + (11 * i) % 190 for i in range(200)]



def make_host(tmp_path: Path, quotas: dict[str, TenantQuota] | None = None, n_seq_max: int = 6) -> BackendHost:
    model = shared_model_path()
    config = BackendConfig(name="tenants", model_path=model, n_ctx=1024, n_seq_max=n_seq_max, kv_budget_tokens=1000,
                           n_threads=1, tenant_quotas=quotas or {})
    return local_host(config, tmp_path / "cold")


def of(tenant: str | None, policy: SessionPolicy | None = None) -> SessionPolicy:
    return (policy or SessionPolicy()).with_retention(tenant=tenant)


def opened(host: BackendHost, sid: str, policy: SessionPolicy | None = None, tokens: list[int] = PROMPT) -> None:
    host.open_session(sid, policy)
    host.append(sid, tokens)


def state(host: BackendHost, sid: str) -> str:
    return str(host.session_stats(sid)["state"])


def test_a_tenant_over_its_resident_quota_suspends_its_own_session_first(tmp_path: Path) -> None:
    host = make_host(tmp_path, {"a": TenantQuota(resident_tokens=100)})
    opened(host, "b-idle", of("b"))  # the least recently used of all, but another tenant's
    opened(host, "a1", of("a"))
    opened(host, "a2", of("a"))
    opened(host, "a3", of("a"))  # 3 x 40 > 100: a1, the tenant's least recently used, goes
    assert [state(host, sid) for sid in ("b-idle", "a1", "a2", "a3")] == ["live", "suspended", "live", "live"]
    usage = host.stats()["tenants"]
    assert usage["a"]["resident_tokens"] == 80 and usage["a"]["resident_quota"] == 100
    assert usage["a"]["sessions"] == 3 and usage["a"]["cold_bytes"] > 0  # a1's parked state
    assert usage["b"] == {"sessions": 1, "resident_tokens": 40, "cold_bytes": 0, "resident_quota": None,
                          "cold_quota": None}
    assert host.session_stats("a3")["tenant"]["name"] == "a"
    host.generate("a1", 4)  # a call brings a1 back: the tenant's least recently used goes now
    assert state(host, "a2") == "suspended" and state(host, "b-idle") == "live"


def test_the_tenants_priorities_order_who_of_it_goes(tmp_path: Path) -> None:
    host = make_host(tmp_path, {"a": TenantQuota(resident_tokens=100)})
    opened(host, "kept", of("a", SessionPolicy().with_retention(priority=3)))
    opened(host, "cheap", of("a"))
    opened(host, "newcomer", of("a"))
    assert state(host, "cheap") == "suspended" and state(host, "kept") == "live"


def test_a_call_that_cannot_fit_the_quota_is_refused_and_commits_nothing(tmp_path: Path) -> None:
    host = make_host(tmp_path, {"small": TenantQuota(resident_tokens=50)})
    opened(host, "s", of("small"))
    with pytest.raises(TenantQuotaError, match=r"tenant 'small' cannot hold 80 resident tokens .* "
                                               r"resident_tokens quota is 50; its sessions hold 40"):
        host.append("s", PROMPT)
    assert len(host.tokens("s")) == 40 and host.session_stats("s")["resident_tokens"] == 40
    host.append("s", PROMPT[:10])  # what fits still goes in
    assert len(host.tokens("s")) == 50


def test_an_evicting_session_is_shrunk_within_its_tenants_quota(tmp_path: Path) -> None:
    host = make_host(tmp_path, {"a": TenantQuota(resident_tokens=150)})
    streaming = SessionPolicy.streaming(200, recent_tokens=32)
    opened(host, "pinned", of("a", SessionPolicy().with_retention(pin=True)))  # 40 that stay
    opened(host, "stream", of("a", streaming), tokens=LONG[:100])
    host.append("stream", LONG[100:130])  # 40 + 130 > 150: the streaming session evicts from its middle
    assert state(host, "pinned") == "live" and host.session_stats("stream")["resident_tokens"] <= 110
    assert host.session_stats("stream")["counters"]["evictions"] > 0
    assert host.stats()["tenants"]["a"]["resident_tokens"] <= 150
    assert len(host.tokens("stream")) == 130  # every token stays in the log


def _parked_bytes(tmp_path: Path) -> int:
    host = make_host(tmp_path)
    opened(host, "probe")
    host.suspend("probe")
    return sum(entry["bytes"] for entry in host.session_stats("probe")["cold"].values())


def test_the_cold_quota_drops_the_oldest_parked_state_which_resumes_by_recompute(tmp_path: Path) -> None:
    one = _parked_bytes(tmp_path / "probe")
    host = make_host(tmp_path, {"c": TenantQuota(cold_bytes=one + one // 2)})
    opened(host, "c1", of("c"))
    opened(host, "c2", of("c"))
    opened(host, "twin", of("other"))
    host.suspend("c1")
    host.suspend("c2")  # two parked states do not fit: c1's, the older, is dropped
    c1, c2 = host.session_stats("c1"), host.session_stats("c2")
    assert c1["counters"]["quota_drops"] > 0 and not c1["cold"] and c2["cold"]
    assert c2["counters"]["quota_drops"] == 0
    assert host.stats()["tenants"]["c"]["cold_bytes"] <= one + one // 2
    assert host.generate("c1", 12) == host.generate("twin", 12)  # recomputed from its log, the same
    assert host.session_stats("c1")["counters"]["recomputed_tokens"] == len(PROMPT)


def test_the_cold_quota_drops_spilled_blocks_before_parked_states(tmp_path: Path) -> None:
    one = _parked_bytes(tmp_path / "probe")
    host = make_host(tmp_path, {"c": TenantQuota(cold_bytes=one + one // 4)})
    streaming = SessionPolicy.streaming(96, recent_tokens=32, block_size=16)
    opened(host, "spiller", of("c", streaming), tokens=LONG)  # spills most of 200 tokens
    spilled = host.session_stats("spiller")
    assert spilled["counters"]["spills"] > 0
    opened(host, "parked", of("c"))
    host.suspend("parked")
    assert host.session_stats("parked")["cold"] and host.session_stats("parked")["counters"]["quota_drops"] == 0
    assert host.session_stats("spiller")["counters"]["quota_drops"] > 0
    assert host.stats()["tenants"]["c"]["cold_bytes"] <= one + one // 4


@pytest.mark.parametrize(("make", "named"), [
    (lambda: SessionPolicy().with_retention(tenant="has space"), "tenant"),
    (lambda: SessionPolicy().with_retention(tenant="x" * 65), "tenant"),
    (lambda: TenantQuota(resident_tokens=-1), "resident_tokens"),
    (lambda: TenantQuota(cold_bytes=-5), "cold_bytes"),
    (lambda: TenantQuota(resident_token=5), "resident_token"),
    (lambda: BackendConfig(tenant_quotas={"bad label!": TenantQuota()}), "'bad label!'"),
])
def test_bad_tenants_and_quotas_are_named(make, named: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=named):
        make()
