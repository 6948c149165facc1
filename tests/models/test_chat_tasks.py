"""The chat model's data (models/chat_tasks.py), template and vocabulary (models/chat_vocab.py).

No torch, no weights: the tokenizer checks load a vocabulary-only GGUF in llama.cpp.
"""

from __future__ import annotations

import random

import pytest

from models import chat_tasks as ct
from models import chat_tools as ct_tools
from models import chat_vocab as cv


def test_conversations_are_seed_addressed() -> None:
    a = ct.conversation_set("heldout", 30, seed=7)
    b = ct.conversation_set("heldout", 30, seed=7)
    assert [c.messages for c in a] == [c.messages for c in b]
    assert [c.messages for c in a] != [c.messages for c in ct.conversation_set("train", 30, seed=7)]
    for c in a:
        assert 1 <= c.n_turns <= 6
        roles = [m["role"] for m in c.messages if m["role"] != "system"]
        assert roles == ["user", "assistant"] * c.n_turns


def test_every_family_answers_right() -> None:
    rng = random.Random(0)
    for _ in range(300):
        state = ct._State()
        q, a = ct.user_turn(rng, "add", state)
        nums = [int(t) for t in q.replace("?", " ").replace(".", " ").split() if t.isdigit()]
        assert a == f"{nums[0] + nums[1]}."
        q, a = ct.user_turn(rng, "subtract", state)
        nums = [int(t) for t in q.replace("?", " ").split() if t.isdigit()]
        assert a == f"{nums[0] - nums[1]}." and nums[0] >= nums[1]
        q, a = ct.user_turn(rng, "spell", state)
        word = q.rstrip("?.").split()[-1]
        assert a == "-".join(word) + "."
        q, a = ct.user_turn(rng, "repeat", state)
        assert q.endswith(a)
    state = ct._State()
    q, a = ct.user_turn(random.Random(3), "name", state)
    if state.name is not None:
        assert a == f"nice to meet you, {state.name}."
    with pytest.raises(ValueError, match="unknown family 'poetry'"):
        ct.user_turn(rng, "poetry", state)


def test_name_is_remembered_across_turns() -> None:
    for conv in ct.conversation_set("heldout", 200, seed=1):
        name = None
        for q, a in zip(conv.messages[:-1], conv.messages[1:], strict=True):
            if q["role"] != "user":
                continue
            if a["content"].startswith("nice to meet you, "):
                name = a["content"].removeprefix("nice to meet you, ").rstrip(".")
            elif q["content"] in ct._PHRASES["ask"]:
                assert a["content"] == (ct.DONT_KNOW if name is None else f"{name}.")


def test_template_renders_zephyr_style() -> None:
    msgs = [{"role": "system", "content": "be brief."}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello! how can i help you?"}, {"role": "user", "content": "bye"}]
    assert cv.render(msgs) == (
        "<|system|>\nbe brief.</s>\n<|user|>\nhi</s>\n<|assistant|>\nhello! how can i help you?</s>\n"
        "<|user|>\nbye</s>\n"
    )
    assert cv.render(msgs, add_generation_prompt=True) == cv.render(msgs) + "<|assistant|>\n"
    # plain jinja2 (as llama.cpp's own engine would see it) renders the same text
    import jinja2

    plain = jinja2.Environment().from_string(cv.CHAT_TEMPLATE)
    assert plain.render(messages=msgs, add_generation_prompt=True, eos_token="</s>") == cv.render(msgs, True)


def test_vocabulary_layout() -> None:
    import gguf

    v = cv.build_vocab(ct.corpus_words())
    assert v.tokens[:3] == ("<unk>", "<s>", "</s>")
    assert v.tokens[3:259] == tuple(f"<0x{b:02X}>" for b in range(256))
    assert set(v.types[3:259]) == {gguf.TokenType.BYTE}
    assert v.tokens[259:262] == cv.ROLE_TOKENS
    assert set(v.types[259:262]) == {gguf.TokenType.CONTROL}
    assert len(set(v.tokens)) == len(v)
    assert v == cv.build_vocab(reversed(ct.corpus_words()))
    with pytest.raises(ValueError, match="'café'"):
        cv.build_vocab(["café"])


@pytest.fixture(scope="module")
def tok() -> cv.ChatTokenizer:
    pytest.importorskip("llama_cpp")
    return cv.ChatTokenizer.for_vocab(cv.build_vocab(ct.corpus_words()))


def test_words_are_single_tokens_after_a_space_and_a_newline(tok: cv.ChatTokenizer) -> None:
    for word in ct.corpus_words():
        assert [tok.piece(t) for t in tok.tokenize(f"x {word}", False, False)][1:] == [cv.SPACE + word], word
        assert [tok.piece(t) for t in tok.tokenize(f"\n{word}", False, False)][1:] == [word], word


def test_template_tokens_are_control_tokens_and_prefixes(tok: cv.ChatTokenizer) -> None:
    system, user, assistant = (tok.tokenize(t, False, True) for t in cv.ROLE_TOKENS)
    assert (system, user, assistant) == ([259], [260], [261])
    for conv in ct.conversation_set("heldout", 40, seed=3):
        full = tok.tokenize(cv.render(conv.messages), add_bos=True, special=True)
        assert full[0] == cv.BOS_ID and full.count(cv.EOS_ID) == len(conv.messages)
        assert tok.detokenize(full[1:], render_special=True) == cv.render(conv.messages)
        for k in range(1, len(conv.messages) + 1):  # every turn boundary is a token boundary
            head = conv.messages[:k]
            for gen in (False, True) if head[-1]["role"] == "user" else (False,):
                ids = tok.tokenize(cv.render(head, gen), add_bos=True, special=True)
                assert full[: len(ids)] == ids


def test_any_text_tokenizes_and_round_trips(tok: cv.ChatTokenizer) -> None:
    rng = random.Random(5)
    texts = ["Hello, wörld! 日本語 🙂\t~#@ x\n", "Ünïcödé ﬁ \u0301 \u200b zero-width", "\x01\x7f control"]
    for _ in range(50):
        lo, hi = rng.choice([(0x20, 0x7E), (0xA0, 0x2FF), (0x400, 0x4FF), (0x4E00, 0x9FFF), (0x1F300, 0x1F6FF)])
        texts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 40))))
    for text in texts:
        ids = tok.tokenize(text, add_bos=False, special=False)
        assert cv.UNK_ID not in ids
        assert tok.detokenize(ids) == text


TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "add two numbers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
    # the JSON schema the OpenAI Agents SDK sends (pydantic: titles, additionalProperties), a long description
    {"type": "function", "function": {"name": "lookup", "description": "Look up the value stored under a key\nin "
                                      "the table of values that the user keeps.", "parameters": {
        "properties": {"key": {"title": "Key", "type": "string"}}, "required": ["key"], "type": "object",
        "additionalProperties": False}}},
]


def test_template_renders_tools_calls_and_results() -> None:
    msgs = [
        {"role": "user", "content": "what is 3 plus 4?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 3, "b": 4}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "7"},
        {"role": "assistant", "content": "7."},
    ]
    assert cv.render(msgs, tools=TOOLS) == (
        "<|system|>\ntools:\nadd(a: integer, b: integer): add two numbers.\n"
        "lookup(key: string): Look up the value stored under a key in the tabl\n</s>\n"
        "<|user|>\nwhat is 3 plus 4?</s>\n"
        '<|assistant|>\n<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call></s>\n'
        "<|tool|>\n7</s>\n<|assistant|>\n7.</s>\n"
    )
    assert ct.reply_text(msgs[1]) == '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>'
    # arguments as a mapping (transformers' form), a tool without the "function" wrapper, no tools
    msgs[1]["tool_calls"][0]["function"]["arguments"] = {"a": 3, "b": 4}
    bare = [{"name": "now", "description": "", "parameters": {"type": "object", "properties": {}}}]
    assert cv.render(msgs[:2], tools=bare) == (
        "<|system|>\ntools:\nnow()\n</s>\n<|user|>\nwhat is 3 plus 4?</s>\n"
        '<|assistant|>\n<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call></s>\n'
    )
    assert cv.render(msgs[:1], tools=[]) == cv.render(msgs[:1])
    import jinja2

    plain = jinja2.Environment().from_string(cv.CHAT_TEMPLATE)
    assert plain.render(messages=msgs, tools=TOOLS, add_generation_prompt=True, eos_token="</s>") == cv.render(
        msgs, True, tools=TOOLS)


def test_tool_conversations_call_the_request_tools_and_use_the_results() -> None:
    import json

    names_seen = set()
    for conv in ct.conversation_set("heldout-tools", 200, seed=3, kind="tools"):
        assert conv.tools and len(conv.families) == len(conv.replies())
        specs = {t["function"]["name"]: t["function"] for t in conv.tools}
        result = None
        for msg in conv.messages:
            if msg["role"] == "tool":
                result = msg["content"]
            if msg["role"] != "assistant" or not msg.get("tool_calls"):
                continue
            call = msg["tool_calls"][0]["function"]
            args = json.loads(call["arguments"])
            assert list(args) == list(specs[call["name"]]["parameters"]["properties"]), (call, specs)
            names_seen.add(call["name"])
        finals = [r for r, f in zip(conv.replies(), conv.families, strict=True) if f == "tool_answer"]
        assert finals == [f"{result}."]
        # arithmetic: every call's result is its arguments added or multiplied
        for m, t in zip(conv.messages, conv.messages[1:], strict=False):
            if m["role"] == "assistant" and m.get("tool_calls") and t["role"] == "tool":
                f = m["tool_calls"][0]["function"]
                values = list(json.loads(f["arguments"]).values())
                if f["name"] in ct_tools.ADD_NAMES:
                    assert t["content"] == str(sum(values))
                elif f["name"] in ct_tools.MUL_NAMES:
                    assert t["content"] == str(values[0] * values[1])
    assert len(names_seen) > 15  # the names vary


def test_json_replies_parse_and_answer_the_question() -> None:
    import json

    seen = 0
    for conv in ct.conversation_set("heldout", 300, seed=5):
        for q, fam, reply in zip([m for m in conv.messages if m["role"] == "user"], conv.families, conv.replies(),
                                 strict=True):
            if fam != "json":
                continue
            value = json.loads(reply)
            assert isinstance(value, dict) and value, reply
            if "plus" in q["content"] and "json" in q["content"] and "answer" in value:
                seen += 1
    assert seen > 0


def test_name_recall_conversations_ask_gap_turns_later() -> None:
    for gap_lo, gap_hi in ((3, 5), (5, 10)):
        for conv in ct.conversation_set("heldout-recall", 100, seed=2, kind="recall", min_gap=gap_lo,
                                        max_gap=gap_hi, made_up_p=0.0):
            users = [m["content"] for m in conv.messages if m["role"] == "user"]
            tell = next(i for i, f in enumerate(conv.families) if f == "name")
            assert gap_lo <= len(users) - 1 - tell <= gap_hi
            name = conv.replies()[tell].removeprefix("nice to meet you, ").rstrip(".")
            assert name in ct.NAMES and conv.replies()[-1] == f"{name}."


def test_tool_tokens_are_single_tokens_that_detokenize_as_text(tok: cv.ChatTokenizer) -> None:
    call = '<tool_call>{"name": "add", "arguments": {"a": 3}}</tool_call>'
    for special in (True, False):
        ids = tok.tokenize(call, add_bos=False, special=special)
        assert tok.piece(ids[0]) == cv.CALL_OPEN and tok.piece(ids[-1]) == cv.CALL_CLOSE
        assert tok.detokenize(ids) == call
    assert tok.tokenize(cv.TOOL_ROLE, False, True) == [262]
    for conv in ct.conversation_set("heldout-tools", 20, seed=3, kind="tools"):
        full = tok.tokenize(cv.render(conv.messages, tools=conv.tools), add_bos=True, special=True)
        for k in range(1, len(conv.messages) + 1):  # every message boundary is a token boundary
            head = cv.render(conv.messages[:k], add_generation_prompt=conv.messages[k - 1]["role"] != "assistant",
                             tools=conv.tools)
            ids = tok.tokenize(head, add_bos=True, special=True)
            assert full[: len(ids)] == ids or ids[-2:] == tok.tokenize("<|assistant|>\n", False, True)
