"""What agents use besides tools, through ``kvres serve`` and the real ``openai`` client:
``top_logprobs`` (the engine's own log-probabilities, checked against llama-cpp-python's logits of
the same tokens), ``logit_bias``, ``n`` > 1 as forks of one session (the prompt prefilled once:
the backend's engine counter read by a driver of its own; streamed too), and Responses ``input_items`` in the
specification's shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import numpy as np
import openai
import pytest

from tests.cluster.task_event_probe import gcs_address_under
from tests.conftest import REPO_ROOT, wait_until
from tests.serve.conftest import served_model_path

STORY = [{"role": "user", "content": "Tell me a short story about a cat, a dog and a bird who find a red ball in the "
                                     "park on a sunny day, and what they do with it before the rain comes."}]

POEM = [{"role": "user", "content": "Write a poem about the sea."}]  # the default model's replies vary here


def _log(server, session_id: str) -> list[int]:
    return server.http().get(f"/v1/sessions/{session_id}/tokens").json()["tokens"]


def _chat(server, session_id: str | None = None, **body: object) -> dict:
    headers = {"X-Session-Id": session_id} if session_id else {}
    r = server.http().post("/v1/chat/completions", json={"model": server.model, "messages": STORY, "max_tokens": 6,
                                                         "temperature": 0, **body}, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def test_top_logprobs_are_the_engines(server) -> None:
    from llama_cpp import Llama

    sid = f"toplp-{uuid.uuid4().hex[:8]}"
    client = server.client()
    reply = client.chat.completions.create(model=server.model, messages=STORY, max_tokens=6, temperature=0,
                                           logprobs=True, top_logprobs=5, extra_headers={"X-Session-Id": sid})
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens and content
    log = _log(server, sid)
    prompt_len = reply.usage.prompt_tokens
    llm = Llama(str(served_model_path(REPO_ROOT)), n_ctx=2048, logits_all=True, n_threads=1, verbose=False)
    llm.eval(log)
    for step, token in enumerate(content):
        assert len(token.top_logprobs) == 5
        logits = np.asarray(llm.scores[prompt_len - 1 + step], dtype=np.float64)
        expected = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        best = np.argsort(-expected, kind="stable")[:5]
        assert [alt.logprob for alt in token.top_logprobs] == pytest.approx([expected[t] for t in best], abs=1e-2)
        assert int(best[0]) == log[prompt_len + step]  # greedy took the likeliest
        assert token.top_logprobs[0].token == token.token
        assert token.top_logprobs[0].logprob == pytest.approx(token.logprob, abs=1e-6)
        assert all(alt.bytes == list(alt.token.encode("utf-8")) for alt in token.top_logprobs)
    assert server.http().delete(f"/v1/sessions/{sid}").status_code == 200

    # streamed: the same alternatives, on the chunk that carries the log-probabilities
    stream = client.chat.completions.create(model=server.model, messages=STORY, max_tokens=6, temperature=0,
                                            logprobs=True, top_logprobs=5, stream=True)
    streamed = [t for chunk in stream for c in chunk.choices if c.logprobs for t in c.logprobs.content]
    assert [[(a.token, round(a.logprob, 3)) for a in t.top_logprobs] for t in streamed] == \
        [[(a.token, round(a.logprob, 3)) for a in t.top_logprobs] for t in content]

    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=server.model, messages=STORY, logprobs=True, top_logprobs=21)
    assert bad.value.body["param"] == "top_logprobs" and "20" in bad.value.body["message"]
    # /v1/completions: logprobs up to 5 gives as many alternatives per token
    done = client.completions.create(model=server.model, prompt="Once upon a time", max_tokens=4, temperature=0,
                                     logprobs=3, extra_body={"ignore_eos": True})
    tops = done.choices[0].logprobs.top_logprobs
    assert len(tops) == 4 and all(1 <= len(top) <= 3 for top in tops)


def test_logit_bias_forces_and_bans_tokens(server) -> None:
    plain, up, down = (f"bias-{kind}-{uuid.uuid4().hex[:6]}" for kind in ("plain", "up", "down"))
    answer = _chat(server, plain)
    reply_tokens = _log(server, plain)[-answer["usage"]["completion_tokens"]:]
    forced = next(t for t in range(300, 1000) if t not in reply_tokens)
    first = _chat(server, up, logit_bias={str(forced): 100})
    assert _log(server, up)[-first["usage"]["completion_tokens"]:] == [forced] * 6
    banned = _chat(server, down, logit_bias={str(reply_tokens[0]): -100})
    assert reply_tokens[0] not in _log(server, down)[-banned["usage"]["completion_tokens"]:]
    for sid in (plain, up, down):
        server.http().delete(f"/v1/sessions/{sid}")
    client = server.client()
    for bias, word in (({"5": 101}, "5"), ({"five": 1}, "five"), ({"99999999": 1}, "99999999")):
        with pytest.raises(openai.BadRequestError) as bad:
            client.chat.completions.create(model=server.model, messages=STORY, max_tokens=2, logit_bias=bias)
        assert bad.value.body["param"].startswith("logit_bias") and word in bad.value.body["message"]


DRIVER = """
import json, os, sys
import httpx, ray
from kvres.cluster.ray_auth import follow_local_token

follow_local_token()
ray.init(address=sys.argv[1], namespace=sys.argv[2], log_to_driver=False)
backend = ray.get_actor("kvres-backend-b0")
engine = lambda: ray.get(backend.stats.remote())["loop"]["engine_tokens"]
before = engine()
r = httpx.post(sys.argv[3], json=json.loads(sys.argv[4]), headers={"Authorization": "Bearer " + os.environ["KEY"],
               **json.loads(sys.argv[5])}, timeout=300)
after = engine()
print(json.dumps({"status": r.status_code, "body": r.json(), "engine_tokens": after - before}))
"""


def _counted(server, body: dict, headers: dict[str, str]) -> tuple[dict, int]:
    """The answer to ``body`` and the tokens the backend's engine decoded for it."""
    address = gcs_address_under(server.process.pid)
    assert address is not None, server.log()
    namespace = server.process.args[server.process.args.index("--namespace") + 1]
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "KEY": server.key}
    done = subprocess.run([sys.executable, "-c", DRIVER, address, namespace, f"{server.v1}/chat/completions",
                           json.dumps(body), json.dumps(headers)], capture_output=True, text=True, timeout=300,
                          env=env, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["status"] == 200, seen
    return seen["body"], seen["engine_tokens"]


def test_n_choices_fork_one_prefilled_prompt(server) -> None:
    sid = f"choices-{uuid.uuid4().hex[:8]}"
    body = {"model": server.model, "messages": POEM, "max_tokens": 16, "temperature": 1.0, "seed": 11, "n": 4,
            "ignore_eos": True}
    before = {s["id"] for s in server.http().get("/v1/sessions", params={"limit": 100}).json()["data"]}
    answer, decoded = _counted(server, body, {"X-Session-Id": sid})
    choices = answer["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert len({c["message"]["content"] for c in choices}) == 4, choices
    prompt, completion = answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"]
    assert completion == 4 * 16
    # the prompt went through the engine once (a second prefill would pass the bound); each choice's
    # tokens once (the last one of each at most not)
    assert prompt + completion - 4 <= decoded <= prompt + completion, (decoded, prompt, completion)
    # the bound session keeps choice 0; the forks are gone
    log = _log(server, sid)
    assert len(log) == prompt + 16
    after = {s["id"] for s in server.http().get("/v1/sessions", params={"limit": 100}).json()["data"]}
    assert after - before == {sid}
    # choice i is sampled with seed + i
    client = server.client()
    alone = client.chat.completions.create(model=server.model, messages=POEM, max_tokens=16, temperature=1.0,
                                           seed=13, extra_body={"ignore_eos": True})
    assert alone.choices[0].message.content == choices[2]["message"]["content"]
    assert server.http().delete(f"/v1/sessions/{sid}").status_code == 200

    stateless = client.chat.completions.create(model=server.model, messages=POEM, max_tokens=4, temperature=0, n=3)
    assert [c.index for c in stateless.choices] == [0, 1, 2]
    assert len({c.message.content for c in stateless.choices}) == 1  # greedy: the same reply three times
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=server.model, messages=POEM, n=9)
    assert bad.value.body["param"] == "n" and "8" in bad.value.body["message"]


def test_n_choices_stream_side_by_side(server) -> None:
    """Streamed, the choices' pieces come interleaved, each chunk's ``index`` saying whose: they
    read as the same request's choices unstreamed (choice i sampled with seed + i), the usage
    counts the prompt once, and a bound session keeps choice 0 (the forks are gone)."""
    client = server.client()
    ask = {"model": server.model, "messages": POEM, "max_tokens": 12, "temperature": 1.0, "seed": 21, "n": 3,
           "extra_body": {"ignore_eos": True}}
    whole = client.chat.completions.create(**ask)

    def ids() -> set[str]:
        return {s["id"] for s in server.http().get("/v1/sessions", params={"limit": 1000}).json()["data"]}

    before = ids()
    sid = f"streamed-choices-{uuid.uuid4().hex[:8]}"
    texts, finish, usage, indexes = ["", "", ""], [None, None, None], None, []
    for chunk in client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True},
                                                extra_headers={"X-Session-Id": sid}):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            indexes.append(choice.index)
            texts[choice.index] += choice.delta.content or ""
            finish[choice.index] = choice.finish_reason or finish[choice.index]
    assert set(indexes) == {0, 1, 2}
    assert texts == [c.message.content for c in whole.choices] and len(set(texts)) == 3, (texts, whole.choices)
    assert finish == ["length"] * 3
    assert usage is not None and usage.completion_tokens == 3 * 12
    assert usage.prompt_tokens == whole.usage.prompt_tokens and usage.prompt_tokens_details.cached_tokens == 0
    assert len(_log(server, sid)) == usage.prompt_tokens + 12  # choice 0 stays in the bound session
    assert wait_until(lambda: ids() - before == {sid}), ids() - before  # the forks closed once their streams ended
    assert server.http().delete(f"/v1/sessions/{sid}").status_code == 200


def test_input_items_in_the_specifications_shape(server) -> None:
    client = server.client()
    items = [{"role": "system", "content": "Be brief."},
             {"role": "user", "content": [{"type": "input_text", "text": "Hello"}]},
             {"role": "assistant", "content": "Hi."},
             {"role": "user", "content": "Tell me about cats."}]
    made = client.responses.create(model=server.model, input=items, max_output_tokens=3, temperature=0)
    listed = client.responses.input_items.list(made.id)
    assert listed.object == "list" and not listed.has_more
    data = listed.data  # newest first, as the specification's default order is
    assert [(d.type, d.role) for d in data] == [("message", "user"), ("message", "assistant"),
                                                ("message", "user"), ("message", "system")]
    assert data[0].content[0].type == "input_text" and data[0].content[0].text == "Tell me about cats."
    assert data[1].content[0].type == "output_text" and data[1].content[0].text == "Hi."
    assert all(d.id and d.status == "completed" for d in data)
    assert listed.first_id == data[0].id and listed.last_id == data[-1].id
    ids = [d.id for d in reversed(data)]
    page = client.responses.input_items.list(made.id, order="asc", limit=2)
    assert [d.id for d in page.data] == ids[:2] and page.has_more and page.last_id == ids[1]
    rest = client.responses.input_items.list(made.id, order="asc", limit=2, after=page.last_id)
    assert [d.id for d in rest.data] == ids[2:] and not rest.has_more
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.input_items.list(made.id, limit=0)
    assert bad.value.body["param"] == "limit"
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.input_items.list(made.id, after="msg_nope")
    assert bad.value.body["param"] == "after"
