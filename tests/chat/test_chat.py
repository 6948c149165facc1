"""A chat through ``Session.chat`` on the project's default model: its own template (Jinja2, from
the GGUF), each turn prefilling exactly that turn's new tokens, replies ending at EOS, and the
session's log equal to the template rendered over the whole conversation."""

from __future__ import annotations

from kvres.actors.chat_source import read_chat_template
from kvres.actors.chat_template import render_chat
from kvres.actors.default_model import default_model_path

QUESTIONS = ["what is 2 plus 3?", "repeat: red blue green", "what comes after 7?", "spell cat", "what is 4 plus 4?"]


def test_a_five_turn_chat_prefills_only_each_new_turn(manager) -> None:
    source = read_chat_template(default_model_path())
    assert source is not None, "the default model has no chat template"
    backend = manager.backend("chat")
    messages: list[dict[str, str]] = [{"role": "system", "content": "You answer briefly."}]
    held = ""  # what the session holds, as the template renders it
    with manager.open_session(backend="chat") as s:
        for question in QUESTIONS:
            messages.append({"role": "user", "content": question})
            turn = render_chat(source, messages, add_generation_prompt=True)
            assert turn.startswith(held)
            new = backend.tokenize(turn[len(held):], add_bos=not held and source.add_bos, special=True)
            reply = s.chat(messages, max_tokens=48)
            assert reply.finish_reason == "eos", reply
            assert reply.prompt_tokens == len(new)  # this turn's tokens, not the conversation's
            assert reply.text
            messages.append({"role": "assistant", "content": reply.text})
            held = render_chat(source, messages, add_generation_prompt=False)
            assert s.text() == (source.bos_token if source.add_bos else "") + held
        assert s.stats()["token_count"] == len(s.tokens())


def test_a_model_without_a_template_is_named(manager) -> None:
    import pytest

    from kvres.policy import CapabilityError

    with manager.open_session(backend="b0") as s, pytest.raises(CapabilityError, match="no chat template"):
        s.chat([{"role": "user", "content": "hi"}])
