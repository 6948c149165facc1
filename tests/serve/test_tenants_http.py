"""API keys that name a tenant, against a real ``kvres serve``: the sessions a key's requests open
count against that tenant's quota (``BackendConfig.tenant_quotas``); past it the request is a 429
naming the tenant, and a key without a tenant opens sessions of no tenant. A key reaches only its
own tenant's sessions and stored responses: another tenant's answer as unknown ones."""

from __future__ import annotations

import httpx

from .conftest import TENANT, TENANT_QUOTA, Server


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _chat(server: Server, key: str, session: str | None, words: int) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", **({"X-Session-Id": session} if session else {})}
    body = {"model": server.model, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": " ".join(["story"] * words)}]}
    return httpx.post(f"{server.v1}/chat/completions", json=body, headers=headers, timeout=120)


def test_a_tenant_keys_sessions_count_against_its_quota(server: Server) -> None:
    answer = _chat(server, server.tenant_key, "tenant-bound-1", 5)
    assert answer.status_code == 200, answer.text
    stats = httpx.get(f"{server.v1}/sessions/tenant-bound-1", headers=_auth(server.tenant_key), timeout=60).json()
    assert stats["tenant"]["name"] == TENANT and stats["tenant"]["resident_quota"] == TENANT_QUOTA
    assert stats["tenant"]["resident_tokens"] >= stats["resident_tokens"] > 0
    other = _chat(server, server.key, "tenant-less-1", 5)  # the server's other key names no tenant
    assert other.status_code == 200, other.text
    assert httpx.get(f"{server.v1}/sessions/tenant-less-1", headers=server.headers(), timeout=60).json()["tenant"] is None
    for key, sid in ((server.tenant_key, "tenant-bound-1"), (server.key, "tenant-less-1")):
        assert httpx.delete(f"{server.v1}/sessions/{sid}", headers=_auth(key), timeout=60).status_code == 200


def test_a_request_past_its_tenants_quota_is_a_429_naming_the_tenant(server: Server) -> None:
    refused = _chat(server, server.tenant_key, None, TENANT_QUOTA + 50)  # more tokens than the quota alone
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "tenant_quota" and TENANT in error["message"] and str(TENANT_QUOTA) in error["message"]
    fits = _chat(server, server.key, None, TENANT_QUOTA + 50)  # the same request under a key of no tenant
    assert fits.status_code == 200, fits.text


def test_a_key_reaches_only_its_own_tenants_sessions(server: Server) -> None:
    mine, theirs, sid = server.tenant_key, server.key, "fenced-1"
    assert _chat(server, mine, sid, 5).status_code == 200
    length = httpx.get(f"{server.v1}/sessions/{sid}", headers=_auth(mine), timeout=60).json()["token_count"]
    missing = httpx.get(f"{server.v1}/sessions/never-opened-1", headers=_auth(theirs), timeout=60)
    assert missing.status_code == 404
    for method, path, body in (("GET", "", None), ("GET", "/tokens", None), ("POST", "/suspend", None),
                               ("POST", "/resume", None), ("POST", "/fork", {"new_id": "stolen-1"}),
                               ("POST", "/rollback", {"count": 1}), ("POST", "/export", None), ("DELETE", "", None)):
        answer = httpx.request(method, f"{server.v1}/sessions/{sid}{path}", json=body, headers=_auth(theirs), timeout=60)
        assert answer.status_code == 404, (method, path, answer.text)
        error = answer.json()["error"]  # word for word what an id that never existed gets
        assert error == {**missing.json()["error"], "message": error["message"]}, error
        assert error["message"] == missing.json()["error"]["message"].replace("never-opened-1", sid)
    taken = _chat(server, theirs, sid, 3)  # binding a chat to an id another tenant's session holds
    assert taken.status_code == 409 and taken.json()["error"]["code"] == "session_exists", taken.text
    listed = {key: [s["id"] for s in httpx.get(f"{server.v1}/sessions", headers=_auth(key), timeout=60).json()["data"]]
              for key in (mine, theirs)}
    assert sid in listed[mine] and sid not in listed[theirs]
    assert httpx.get(f"{server.v1}/sessions/stolen-1", headers=_auth(mine), timeout=60).status_code == 404
    stats = httpx.get(f"{server.v1}/sessions/{sid}", headers=_auth(mine), timeout=60).json()
    assert stats["token_count"] == length and stats["state"] != "suspended"  # nothing the other key tried took
    exported = httpx.post(f"{server.v1}/sessions/{sid}/export", headers=_auth(mine), timeout=60)
    assert exported.status_code == 200
    refused = httpx.post(f"{server.v1}/sessions/fenced-copy-1/restore", content=exported.content,
                         headers=_auth(theirs), timeout=60)
    assert refused.status_code == 400 and "another tenant" in refused.json()["error"]["message"], refused.text
    copied = httpx.post(f"{server.v1}/sessions/fenced-copy-1/restore", content=exported.content,
                        headers=_auth(mine), timeout=60)
    assert copied.status_code == 200, copied.text
    for s in (sid, "fenced-copy-1"):
        assert httpx.delete(f"{server.v1}/sessions/{s}", headers=_auth(mine), timeout=60).status_code == 200


def test_a_key_reaches_only_its_own_tenants_stored_responses(server: Server) -> None:
    mine, theirs = server.tenant_key, server.key

    def respond(key: str, previous: str | None = None) -> httpx.Response:
        body = {"model": server.model, "input": "Tell me a story.", "max_output_tokens": 4, "temperature": 0,
                **({"previous_response_id": previous} if previous else {})}
        return httpx.post(f"{server.v1}/responses", json=body, headers=_auth(key), timeout=120)

    first = respond(mine)
    assert first.status_code == 200, first.text
    rid = first.json()["id"]
    for answer in (respond(theirs, rid),
                   httpx.get(f"{server.v1}/responses/{rid}", headers=_auth(theirs), timeout=60),
                   httpx.get(f"{server.v1}/responses/{rid}/input_items", headers=_auth(theirs), timeout=60),
                   httpx.delete(f"{server.v1}/responses/{rid}", headers=_auth(theirs), timeout=60)):
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "response_not_found", answer.text
    session = first.json()["kvres"]["session_id"]
    assert httpx.get(f"{server.v1}/sessions/{session}", headers=_auth(theirs), timeout=60).status_code == 404
    assert httpx.get(f"{server.v1}/responses/{rid}", headers=_auth(mine), timeout=60).status_code == 200
    second = respond(mine, rid)  # the owner continues it: the other key's tries changed nothing
    assert second.status_code == 200, second.text
    assert second.json()["kvres"]["session_id"] == session
    for r in (second.json()["id"], rid):
        assert httpx.delete(f"{server.v1}/responses/{r}", headers=_auth(mine), timeout=60).status_code == 200
