"""API keys that name a tenant, against a real ``kvres serve``: the sessions a key's requests open
count against that tenant's quota (``BackendConfig.tenant_quotas``); past it the request is a 429
naming the tenant, and a key without a tenant opens sessions of no tenant."""

from __future__ import annotations

import httpx

from .conftest import TENANT, TENANT_QUOTA, Server


def _chat(server: Server, key: str, session: str | None, words: int) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", **({"X-Session-Id": session} if session else {})}
    body = {"model": server.model, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": " ".join(["story"] * words)}]}
    return httpx.post(f"{server.v1}/chat/completions", json=body, headers=headers, timeout=120)


def test_a_tenant_keys_sessions_count_against_its_quota(server: Server) -> None:
    answer = _chat(server, server.tenant_key, "tenant-bound-1", 5)
    assert answer.status_code == 200, answer.text
    stats = httpx.get(f"{server.v1}/sessions/tenant-bound-1", headers=server.headers(), timeout=60).json()
    assert stats["tenant"]["name"] == TENANT and stats["tenant"]["resident_quota"] == TENANT_QUOTA
    assert stats["tenant"]["resident_tokens"] >= stats["resident_tokens"] > 0
    other = _chat(server, server.key, "tenant-less-1", 5)  # the server's other key names no tenant
    assert other.status_code == 200, other.text
    assert httpx.get(f"{server.v1}/sessions/tenant-less-1", headers=server.headers(), timeout=60).json()["tenant"] is None
    for sid in ("tenant-bound-1", "tenant-less-1"):
        httpx.delete(f"{server.v1}/sessions/{sid}", headers=server.headers(), timeout=60)


def test_a_request_past_its_tenants_quota_is_a_429_naming_the_tenant(server: Server) -> None:
    refused = _chat(server, server.tenant_key, None, TENANT_QUOTA + 50)  # more tokens than the quota alone
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "tenant_quota" and TENANT in error["message"] and str(TENANT_QUOTA) in error["message"]
    fits = _chat(server, server.key, None, TENANT_QUOTA + 50)  # the same request under a key of no tenant
    assert fits.status_code == 200, fits.text
