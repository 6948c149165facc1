"""The ``openai`` package against a real ``kvres serve``: chat completions (whole and streamed, stop,
JSON schema, logprobs), completions, the Responses API with ``previous_response_id`` (only new
tokens prefilled, a branch from an older turn equal to a fresh conversation), and typed errors."""

from __future__ import annotations

import json

import openai
import pytest

USER = [{"role": "user", "content": "Tell me a short story about a cat."}]
# replies that are plain text whatever the model: a random-weight model may otherwise end a reply inside a
# UTF-8 character, which no message text renders back to the same tokens (the next turn re-prefills it)
TEXT_ONLY = {"grammar": "root ::= [a-z ]+"}


def test_models_lists_the_backend_model(server) -> None:
    models = server.client().models.list()
    assert [m.id for m in models.data] == [server.model]
    assert models.data[0].model_extra["backends"] == ["b0"]


def test_chat_completion_whole_and_streamed_agree(server) -> None:
    client = server.client()
    whole = client.chat.completions.create(model=server.model, messages=USER, max_tokens=12, temperature=0)
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    assert 0 < whole.usage.completion_tokens <= 12
    assert whole.usage.prompt_tokens > 0 and whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    stream = client.chat.completions.create(model=server.model, messages=USER, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_stop_strings_cut_the_reply(server) -> None:
    client = server.client()
    free = client.chat.completions.create(model=server.model, messages=USER, max_tokens=24, temperature=0)
    text = free.choices[0].message.content
    stop = text.strip()[len(text.strip()) // 2:][:2]
    assert stop.strip(), text
    for stream in (False, True):
        reply = client.chat.completions.create(model=server.model, messages=USER, max_tokens=24, temperature=0,
                                               stop=[stop], stream=stream)
        if stream:
            got = "".join(c.choices[0].delta.content or "" for c in reply if c.choices)
        else:
            got = reply.choices[0].message.content
            assert reply.choices[0].finish_reason == "stop"
        assert got == text[: text.find(stop)], (stream, stop, text)


def test_json_schema_response_format_gives_valid_json(server) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                                 "maximum": 9}},
              "required": ["ok", "n"], "additionalProperties": False}
    reply = server.client().chat.completions.create(
        model=server.model, messages=USER, max_tokens=64, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
    data = json.loads(reply.choices[0].message.content)
    assert set(data) == {"ok", "n"} and isinstance(data["ok"], bool) and 0 <= data["n"] <= 9


def test_logprobs_of_the_chosen_tokens(server) -> None:
    reply = server.client().chat.completions.create(model=server.model, messages=USER, max_tokens=6, temperature=0,
                                                    logprobs=True)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert all(t.logprob <= 0.0 for t in content)
    assert "".join(t.token for t in content).strip() == reply.choices[0].message.content.strip()


def test_completions_text_and_token_prompts(server) -> None:
    client = server.client()
    on = {"ignore_eos": True}  # past the model's end token: exactly max_tokens
    text = client.completions.create(model=server.model, prompt="Once upon a time", max_tokens=8, temperature=0,
                                     extra_body=on)
    assert text.object == "text_completion" and text.usage.completion_tokens == 8
    assert text.choices[0].finish_reason == "length"
    streamed = client.completions.create(model=server.model, prompt="Once upon a time", max_tokens=8, temperature=0,
                                         stream=True, extra_body=on)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == text.choices[0].text
    ids = client.completions.create(model=server.model, prompt=[1, 40, 41, 42], max_tokens=4, temperature=0)
    assert ids.usage.prompt_tokens == 4


def _session_of(response) -> str:
    return response.model_extra["kvres"]["session_id"]


def test_responses_chain_prefills_only_new_tokens_and_branches_like_a_fresh_conversation(server) -> None:
    client = server.client()
    http = server.http()
    chain = []
    previous = None
    for turn in range(1, 11):
        r = client.responses.create(model=server.model, input=f"Question number {turn}: what next?",
                                    previous_response_id=previous.id if previous else None,
                                    max_output_tokens=6, temperature=0, extra_body=TEXT_ONLY)
        assert r.status in ("completed", "incomplete") and r.output_text is not None
        if previous is not None:
            assert _session_of(r) == _session_of(previous)
            # the session held everything up to the previous response: only the new turn is prefilled
            assert r.usage.input_tokens_details.cached_tokens == previous.model_extra["kvres"]["session_length"]
        chain.append(r)
        previous = r
    stats = http.get(f"/v1/sessions/{_session_of(previous)}").json()
    assert stats["counters"]["recomputed_tokens"] == 0 and stats["counters"]["rollbacks"] == 0
    assert stats["token_count"] == previous.model_extra["kvres"]["session_length"]
    prefilled = sum(r.usage.input_tokens - r.usage.input_tokens_details.cached_tokens for r in chain)
    assert stats["http"]["prefilled_tokens"] == prefilled and stats["http"]["turns"] == 10
    assert prefilled == chain[-1].usage.input_tokens - sum(r.usage.output_tokens for r in chain[:-1])

    branch = client.responses.create(model=server.model, input="And now something else.",
                                     previous_response_id=chain[4].id, max_output_tokens=8, temperature=0,
                                     extra_body=TEXT_ONLY)
    assert _session_of(branch) != _session_of(chain[4])  # a fork at turn 5
    assert branch.usage.input_tokens_details.cached_tokens == chain[4].model_extra["kvres"]["session_length"]
    fresh = None
    for turn in range(1, 6):
        fresh = client.responses.create(model=server.model, input=f"Question number {turn}: what next?",
                                        previous_response_id=fresh.id if fresh else None,
                                        max_output_tokens=6, temperature=0, extra_body=TEXT_ONLY)
        assert fresh.output_text == chain[turn - 1].output_text
    again = client.responses.create(model=server.model, input="And now something else.",
                                    previous_response_id=fresh.id, max_output_tokens=8, temperature=0,
                                    extra_body=TEXT_ONLY)
    assert again.output_text == branch.output_text
    tokens = http.get(f"/v1/sessions/{_session_of(branch)}/tokens").json()["tokens"]
    assert tokens == http.get(f"/v1/sessions/{_session_of(again)}/tokens").json()["tokens"]
    # the original conversation is untouched by the branch, and goes on from its own latest point
    after = client.responses.create(model=server.model, input="Question number 11: what next?",
                                    previous_response_id=chain[-1].id, max_output_tokens=4, temperature=0,
                                    extra_body=TEXT_ONLY)
    assert _session_of(after) == _session_of(chain[-1])
    assert after.usage.input_tokens_details.cached_tokens == chain[-1].model_extra["kvres"]["session_length"]


def test_responses_retrieve_delete_store_false_and_stream_events(server) -> None:
    client = server.client()
    first = client.responses.create(model=server.model, input="Hello there", instructions="Be brief.",
                                    max_output_tokens=5, temperature=0)
    assert client.responses.retrieve(first.id).output_text == first.output_text
    items = server.http().get(f"/v1/responses/{first.id}/input_items").json()
    assert items["data"][0]["role"] == "user"
    assert items["data"][0]["content"] == [{"type": "input_text", "text": "Hello there"}]
    events = list(client.responses.create(model=server.model, input="More please", previous_response_id=first.id,
                                          max_output_tokens=5, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == text and client.responses.retrieve(final.id).output_text == text

    unstored = client.responses.create(model=server.model, input="Forget me", store=False, max_output_tokens=3)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=server.model, input="x", previous_response_id=unstored.id)
    assert server.http().get(f"/v1/sessions/{_session_of(unstored)}").status_code == 404  # its session closed

    client.responses.delete(final.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(final.id)
    client.responses.delete(first.id)  # the last response of the session: the session is closed
    assert server.http().get(f"/v1/sessions/{_session_of(first)}").status_code == 404


def test_errors_are_typed_and_name_the_value(server) -> None:
    client = server.client()
    with pytest.raises(openai.NotFoundError, match="model"):
        client.chat.completions.create(model="no-such-model", messages=USER)
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=server.model, messages=USER, temperature=7)
    assert bad.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=server.model, messages=[])
    assert bad.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError, match=r"n must be in \[1, 8\]"):
        client.chat.completions.create(model=server.model, messages=USER, n=9)
    with pytest.raises(openai.NotFoundError, match="previous_response_id|no stored response"):
        client.responses.create(model=server.model, input="hi", previous_response_id="resp_missing")
    wrong = openai.OpenAI(base_url=server.v1, api_key="not-the-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


def test_a_continuation_with_other_instructions_leaves_the_stored_point_as_it_was(server) -> None:
    """Instructions apply to one response and come first: a continuation without the previous
    response's instructions renders the conversation anew, on a branch, so the stored response
    still names what it held and continues from there with only its new tokens."""
    client, http = server.client(), server.http()
    first = client.responses.create(model=server.model, input="Question number 1: what next?", instructions="Be brief.",
                                    max_output_tokens=6, temperature=0, extra_body=TEXT_ONLY)
    held = http.get(f"/v1/sessions/{_session_of(first)}/tokens").json()["tokens"]
    other = client.responses.create(model=server.model, input="Question number 2: what next?",
                                    previous_response_id=first.id, max_output_tokens=6, temperature=0,
                                    extra_body=TEXT_ONLY)
    assert _session_of(other) != _session_of(first)
    assert http.get(f"/v1/sessions/{_session_of(first)}/tokens").json()["tokens"] == held
    same = client.responses.create(model=server.model, input="Question number 2: what next?", instructions="Be brief.",
                                   previous_response_id=first.id, max_output_tokens=6, temperature=0,
                                   extra_body=TEXT_ONLY)
    assert _session_of(same) == _session_of(first)
    assert same.usage.input_tokens_details.cached_tokens == first.model_extra["kvres"]["session_length"] == len(held)
