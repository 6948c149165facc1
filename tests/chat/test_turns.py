"""Turns that end where they should: EOS by default, stop ids and strings, max_tokens; the answer
says why. Through kvres.cluster sessions on a local Ray cluster."""

from __future__ import annotations

import pydantic
import pytest

from models import passkey_tasks as pt

PROMPT = list(range(3, 203))


def test_generate_stops_at_end_of_generation_and_says_so(manager) -> None:
    task = pt.make_task(family=1, seed=3, n_tokens=200, depth=0.5)
    with manager.open_session(backend="pk") as s, manager.open_session(backend="pk") as twin:
        s.append(task.prompt_ids)
        twin.append(task.prompt_ids)
        reply = s.generate(40)
        assert reply.finish_reason == "eos"
        assert reply[:-1] == task.answer_ids and reply[-1] in (pt.EOS_ID,)
        assert s.tokens() == task.prompt_ids + list(reply)  # the EOS is committed with the reply
        going_on = twin.generate(40, ignore_eos=True)
        assert going_on.finish_reason == "length" and len(going_on) == 40
        assert going_on[: len(reply)] == reply


def test_stop_ids_stop_strings_and_max_tokens(manager) -> None:
    with manager.open_session(backend="b0") as free:
        free.append(PROMPT)
        free_run = free.generate(48, ignore_eos=True)
        assert free_run.finish_reason == "length" and free_run.text is not None
    stop_id = free_run[10]
    with manager.open_session(backend="b0") as s:
        s.append(PROMPT)
        by_id = s.generate(48, stop_token_ids=[stop_id], ignore_eos=True)
        first = list(free_run).index(stop_id)
        assert list(by_id) == list(free_run[: first + 1]) and by_id.finish_reason == "stop" and by_id.stop == stop_id
    text = free_run.text
    word = text[len(text) // 2: len(text) // 2 + 3]
    with manager.open_session(backend="b0") as s:
        s.append(PROMPT)
        by_text = s.generate(48, stop=word, ignore_eos=True)
        assert by_text.finish_reason == "stop" and by_text.stop == word
        assert word not in by_text.text and text.startswith(by_text.text)
        assert text.find(word) == len(by_text.text)  # cut right before the stop string
        # the log holds every token up to the one that completed the stop string, nothing after
        assert s.tokens() == PROMPT + list(by_text)
        assert list(by_text) == list(free_run[: len(by_text)])
        assert word in s.detokenize(list(by_text)) and word not in s.detokenize(list(by_text)[:-1])


@pytest.mark.parametrize("bad", [2.5, True, "3", -1, None])
def test_max_tokens_must_be_a_whole_number(manager, bad) -> None:
    with manager.open_session(backend="b0") as s:
        s.append(PROMPT[:10])
        with pytest.raises(pydantic.ValidationError, match="max_tokens"):
            s.generate(bad)
        assert s.tokens() == PROMPT[:10]


def test_bad_sampling_parameters_are_named(manager) -> None:
    with manager.open_session(backend="b0") as s:
        s.append(PROMPT[:10])
        with pytest.raises(pydantic.ValidationError, match="top_p"):
            s.generate(4, top_p=1.5)
        with pytest.raises(pydantic.ValidationError, match="nucleus"):
            s.generate(4, nucleus=0.9)
        assert s.tokens() == PROMPT[:10]


def test_sampling_through_the_chain_and_logprobs(manager) -> None:
    with manager.open_session(backend="b0") as a, manager.open_session(backend="b0") as b:
        for s in (a, b):
            s.append(PROMPT)
        greedy = a.generate(16, ignore_eos=True, logprobs=True)
        top1 = b.generate(16, temperature=0.8, seed=7, top_k=1, ignore_eos=True)
        assert list(top1) == list(greedy)  # top_k=1 is greedy, whatever the temperature
        assert greedy.logprobs is not None and len(greedy.logprobs) == 16
        assert all(lp <= 0.0 for lp in greedy.logprobs)


def test_a_grammar_constrained_generate_returns_valid_json(manager) -> None:
    import json

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    with manager.open_session(backend="b0") as s:
        s.append("Once upon a time")
        reply = s.generate(200, json_schema=schema, temperature=0.7, seed=3)
        value = json.loads(reply.text)
        assert isinstance(value["name"], str) and isinstance(value["age"], int)
