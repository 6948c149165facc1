"""Why a bound turn was not cached, over HTTP: a chat whose history was edited at message k answers
``kvres.prefix_break`` with k and the token position (streamed: on its last chunk), an unedited one
answers none, and ``kvres_serve_prefix_breaks_total`` counts the breaks."""

from __future__ import annotations

import json
import re
import uuid

import httpx


def _breaks(server) -> int:
    text = httpx.get(f"{server.base}/metrics", headers=server.headers(), timeout=30).text
    return sum(int(n) for n in re.findall(r'^kvres_serve_prefix_breaks_total\{route="[^"]*"\} (\d+)$', text, re.M))


def test_an_edited_history_is_reported_and_counted(server) -> None:
    client = server.client()
    session = {"X-Session-Id": f"breaks-{uuid.uuid4().hex[:8]}"}
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"}]
    first = client.chat.completions.create(model=server.model, messages=messages, max_tokens=12, temperature=0.0,
                                           extra_headers=session)
    assert first.model_extra["kvres"] == {"session_id": session["X-Session-Id"], "prefix_break": None}
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And of Spain?"}]
    second = client.chat.completions.create(model=server.model, messages=messages, max_tokens=8, temperature=0.0,
                                            extra_headers=session)
    assert second.model_extra["kvres"]["prefix_break"] is None
    before = _breaks(server)

    messages[0] = {"role": "system", "content": "You are terse."}
    messages += [{"role": "assistant", "content": second.choices[0].message.content},
                 {"role": "user", "content": "Thanks."}]
    chunks = list(client.chat.completions.create(model=server.model, messages=messages, max_tokens=4, temperature=0.0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_headers=session))
    marked = [c.model_extra["kvres"] for c in chunks if c.model_extra and "kvres" in c.model_extra]
    assert len(marked) == 1 and marked[0]["prefix_break"]["message"] == 0, marked
    pb = marked[0]["prefix_break"]
    usage = chunks[-1].usage
    assert pb["token"] == usage.prompt_tokens_details.cached_tokens and pb["now"].startswith("terse.")
    assert _breaks(server) == before + 1
    # a stateless turn holds nothing to break from
    plain = client.chat.completions.create(model=server.model, messages=messages, max_tokens=2)
    assert "kvres" not in (plain.model_extra or {})
    json.dumps(pb)  # plain JSON
