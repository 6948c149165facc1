"""llama.cpp's split KV layout (``kv_layout="split"``: one stream per session) on stories260K:
the same tokens as the unified layout for appends, batched decodes, generation, forks, shared
prefixes and rollbacks; blocks move between layouts and stream counts both ways; a session
is held to its stream's cells; what the layout cannot do is refused with ``CapabilityError``
and changes nothing; through a backend host, eviction policies degrade and suspend / resume
continue exactly."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pydantic
import pytest

from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.actors.engines.llama import LlamaExecutor
from kvres.actors.engines.llama.llama_errors import ContextFullError
from kvres.actors.engines.llama.stream_ops import all_streams, one_stream
from kvres.actors.generation import GenerationRequest
from kvres.actors.host.backend import BackendHost
from kvres.policy import CapabilityError, ContextLengthError, Range
from tests.conftest import local_host, shared_model_path

PROMPT = [3 + (7 * i) % 200 for i in range(60)]


def _script(ex: LlamaExecutor) -> dict[str, Any]:
    """One run of everything the two layouts must agree on."""
    out: dict[str, Any] = {}
    ex.open_session("a")
    ex.append("a", PROMPT)
    ex.open_session("b")
    ex.append("b", PROMPT[:30])
    out["batched"] = ex.append_many([("a", [5]), ("b", [6, 7])])
    out["a"] = ex.generate("a", 10)
    ex.fork_session("a", "fork")
    out["fork"], out["a after fork"] = ex.generate("fork", 6), ex.generate("a", 6)
    ex.open_session("shared")
    ex.share_prefix("b", "shared", 20)
    ex.append("shared", PROMPT[20:32])
    out["shared"], out["b"] = ex.generate("shared", 6), ex.generate("b", 6)
    out["rolled back"] = ex.truncate("a", 50)
    out["after rollback"] = ex.generate("a", 6)
    ex.close_session("b")
    out["free"] = ex.free_cells()
    return out


def test_the_split_layout_gives_the_unified_layouts_tokens(make_llama: Callable[..., LlamaExecutor]) -> None:
    unified, split = _script(make_llama()), _script(make_llama(kv_layout="split", flash_attn=True))
    for key in unified:
        if key in ("batched", "rolled back"):
            for u, s in zip(np.atleast_2d(unified[key]), np.atleast_2d(split[key]), strict=True):
                assert float(np.abs(np.asarray(u) - np.asarray(s)).max()) < 1e-4, key
        else:
            assert unified[key] == split[key], key


@pytest.mark.parametrize(("source", "target", "streams"), [("split", "unified", 4), ("unified", "split", 4),
                                                           ("split", "split", 8)])
def test_blocks_move_between_layouts(make_llama: Callable[..., LlamaExecutor], source: str, target: str,
                                     streams: int) -> None:
    # flash attention on in both: without it V rows are stored another way (below)
    a, b = make_llama(kv_layout=source, flash_attn=True), make_llama(kv_layout=target, n_seq_max=streams, flash_attn=True)
    a.open_session("s")
    a.append("s", PROMPT)
    block = a.export_range("s", Range(0, len(PROMPT)))
    assert one_stream(block.payload) == bytes(block.payload)  # stored as one stream, whatever the layout
    b.open_session("s", a.token_log("s"))
    b.import_range("s", block)
    assert a.fingerprint == b.fingerprint and a.generate("s", 8) == b.generate("s", 8)


def test_stream_blobs_convert_both_ways(make_llama: Callable[..., LlamaExecutor]) -> None:
    ex = make_llama(kv_layout="split")
    ex.open_session("s")
    ex.append("s", PROMPT[:10])
    ex.open_session("t")
    ex.append("t", PROMPT[:12])
    raw = ex._ctx.state_get(1)  # the second session's stream, as llama.cpp writes it (4 streams)
    single = one_stream(raw)
    assert len(single) == len(raw) - 4 * 3 and all_streams(single, 4) != raw  # its cells now sit first
    assert one_stream(all_streams(single, 4)) == single


def test_blobs_convert_without_copies_where_they_can(make_llama: Callable[..., LlamaExecutor]) -> None:
    """An export's blob is made in place in the bytes llama.cpp wrote (no copy); a restore's is
    written into the buffer it is given; a read-only payload (a block mapped from Ray's object
    store) restores without a copy and continues exactly."""
    ex = make_llama(kv_layout="split")
    ex.open_session("s")
    ex.append("s", PROMPT[:10])
    ex.open_session("t")
    ex.append("t", PROMPT[:12])
    raw = ex._ctx.state_get(1)
    copied = one_stream(raw)
    in_place = one_stream(raw, owned=True)
    assert isinstance(in_place, memoryview) and bytes(in_place) == copied
    assert np.shares_memory(np.frombuffer(in_place, np.uint8), np.frombuffer(raw, np.uint8))
    into = np.zeros(len(raw) + 64, dtype=np.uint8)
    converted = all_streams(copied, 4, into)
    assert bytes(converted) == all_streams(copied, 4)
    assert np.shares_memory(np.frombuffer(converted, np.uint8), into)
    assert all_streams(copied, 4, np.zeros(8, dtype=np.uint8)) == all_streams(copied, 4)  # too small: new bytes
    assert all_streams(converted, 4) is converted  # already one stream per sequence: itself

    a, b = make_llama(kv_layout="split"), make_llama(kv_layout="split")
    a.open_session("s")
    a.append("s", PROMPT)
    block = a.export_range("s", Range(0, len(PROMPT)))
    frozen = np.frombuffer(bytes(block.payload), dtype=np.uint8).copy()
    frozen.flags.writeable = False
    b.open_session("s", a.token_log("s"))
    b.import_range("s", replace(block, payload=frozen.data))
    assert b.generate("s", 8) == a.generate("s", 8)


def test_a_session_is_held_to_its_streams_cells(make_llama: Callable[..., LlamaExecutor]) -> None:
    ex = make_llama(kv_layout="split")  # 1024 cells over 4 streams: 256 each
    ex.open_session("s")
    ex.append("s", PROMPT)
    with pytest.raises(ContextFullError, match=r"stream holds 256 KV cells .* this one holds 60 and 200 more"):
        ex.append("s", [5] * 200)
    assert ex.token_log("s") == PROMPT and ex.resident_ranges("s") == [Range(0, 60)]
    ex.append("s", [5] * 196)  # exactly what is left
    assert len(ex.token_log("s")) == 256


def test_what_the_split_layout_cannot_do_is_refused(make_llama: Callable[..., LlamaExecutor]) -> None:
    ex = make_llama(kv_layout="split")
    caps = ex.capabilities()
    assert not caps.remove_middle and not caps.position_shift and caps.kv_export
    ex.open_session("s")
    ex.append("s", PROMPT)
    with pytest.raises(CapabilityError, match="removes only a sequence's tail"):
        ex.evict_range("s", Range(10, 20))
    with pytest.raises(CapabilityError, match="exports whole sessions"):
        ex.export_range("s", Range(0, 16))
    with pytest.raises(CapabilityError, match="position_shift"):
        ex.evict_range("s", Range(50, 60), rebase=True)
    assert ex.resident_ranges("s") == [Range(0, 60)]
    twin = make_llama(kv_layout="split")
    twin.open_session("s")
    twin.append("s", PROMPT)
    assert ex.generate("s", 6) == twin.generate("s", 6)  # nothing changed


def test_bad_layouts_are_named(stories_model: Path) -> None:
    with pytest.raises(ValueError, match="kv_layout='diagonal' must be one of 'unified', 'split'"):
        LlamaExecutor(stories_model, n_ctx=256, kv_layout="diagonal")
    with pytest.raises(pydantic.ValidationError, match="kv_layout='split' is a llama.cpp layout; engine='openvino'"):
        BackendConfig(engine="openvino", kv_layout="split")
    with pytest.raises(pydantic.ValidationError, match="kv_layout"):
        BackendConfig(kv_layout="stripes")



def _host(tmp_path: Path, layout: str) -> BackendHost:
    model = shared_model_path()
    config = BackendConfig(name=f"host-{layout}", model_path=model, n_ctx=1024, n_seq_max=2, kv_budget_tokens=1000,
                           n_threads=1, kv_layout=layout)
    return local_host(config, tmp_path / layout)


def test_a_split_backend_degrades_eviction_and_continues_parked_sessions_exactly(tmp_path: Path) -> None:
    split, unified = _host(tmp_path, "split"), _host(tmp_path, "unified")
    for host in (split, unified):
        for sid in ("one", "two", "three"):  # two slots: each newcomer parks the least recently used
            host.open_session(sid)
            host.append(sid, PROMPT[: 20 + len(sid)])
    assert split.session_stats("one")["state"] == "suspended"
    for sid in ("one", "two", "three"):
        assert split.generate(sid, 8) == unified.generate(sid, 8), sid
    split.open_session("streaming", SessionPolicy.streaming(96, recent_tokens=32))
    assert "remove_middle" in str(split.session_stats("streaming")["degraded"]) or \
        "evict from the middle" in str(split.session_stats("streaming")["degraded"])
    with pytest.raises(CapabilityError, match="remove_middle"):
        split.open_session("strict", SessionPolicy.streaming(96, recent_tokens=32, strict=True))


def test_a_call_past_a_sessions_stream_is_refused_by_the_host_and_commits_nothing(tmp_path: Path) -> None:
    host = _host(tmp_path, "split")  # 1024 cells over 2 streams: 512 each, within the 1000-token budget
    host.open_session("s")
    host.append("s", PROMPT)
    with pytest.raises(ContextLengthError, match=r"520 is past the 512 tokens .*KV stream of 512 cells"):
        host.append("s", [5] * 460)
    assert host.tokens("s") == PROMPT and host.session_stats("s")["resident_tokens"] == len(PROMPT)
    host.append("s", [5] * 400)
    assert len(host.tokens("s")) == len(PROMPT) + 400
    reply = host.generate("s", GenerationRequest(max_tokens=100, ignore_eos=True))  # stops at the stream's end
    assert reply.finish_reason == "length" and len(host.tokens("s")) == 512


def _sessions_taking_turns(ex: LlamaExecutor) -> dict[str, Any]:
    """Eight sessions; a step with two replies under way and a turn starting on a high stream, then
    every session on, then one exported and imported again."""
    out: dict[str, Any] = {}
    for i in range(8):
        ex.open_session(f"s{i}")
        ex.append(f"s{i}", PROMPT[i : 20 + 3 * i])
    out["step"] = ex.append_many([("s1", [5]), ("s3", [6]), ("s6", [7, 8, 9])])
    out["turn"] = ex.append_many([("s6", [10]), ("s7", [11, 12]), ("s1", [13])])
    for i in range(8):
        out[f"s{i}"] = ex.generate(f"s{i}", 5)
    block = ex.export_range("s0", Range(0, len(ex.token_log("s0"))))
    out["block"], out["log"] = block, ex.token_log("s0")
    ex.close_session("s0")
    return out


def test_turns_that_start_gather_on_the_lowest_streams_and_go_on_exactly(
        make_llama: Callable[..., LlamaExecutor]) -> None:
    """With eight sessions or more a split layout keeps a spare stream: a session whose turn starts
    above a stream no session of the step holds exchanges streams with the session there, so the
    sessions under way run in fewer passes over the weights; every session goes on as it would
    have (the same tokens as without the moves, logits to float rounding), and its KV exports
    the same."""
    moved = make_llama(kv_layout="split", n_seq_max=8, n_ctx=8 * 256)
    still = make_llama(kv_layout="split", n_seq_max=8, n_ctx=8 * 256)
    still._ops.spare = None  # the same context, never moving a session
    got = _sessions_taking_turns(moved)
    seqs = {sid: s.seq for sid, s in moved._sessions.items()}
    assert seqs["s6"] == 0 and seqs["s7"] == 2  # the turns that started went to the lowest free of the step
    assert {seqs["s1"], seqs["s3"]} == {1, 3}  # replies under way stay where they are
    assert (seqs["s2"], sorted(seqs.values())) == (7, [0, 1, 2, 3, 4, 5, 7])  # s0 went to 6 and closed there
    want = _sessions_taking_turns(still)
    for key in want:
        if key in ("step", "turn"):  # (micro-batches of other sizes: the last float digit may differ)
            for a, b in zip(want[key], got[key], strict=True):
                assert float(np.abs(a - b).max()) < 1e-4, key
        elif key != "block":
            assert want[key] == got[key], key
    # the session that was moved aside exports KV that goes on as the unmoved one's does
    replies = []
    for out in (want, got):
        fresh = make_llama(kv_layout="split", n_seq_max=8, n_ctx=8 * 256)
        fresh.open_session("s0", out["log"])
        fresh.import_range("s0", out["block"])
        replies.append(fresh.generate("s0", 6))
    assert replies[0] == replies[1]


def test_a_split_layout_below_eight_sessions_has_no_spare_stream(make_llama: Callable[..., LlamaExecutor]) -> None:
    from kvres.actors.backend_setup.engine_registry import llama_spare_streams
    from kvres.actors.config import BackendConfig
    from kvres.actors.engines.llama.cache_shape import SPARE_STREAM_SESSIONS

    assert SPARE_STREAM_SESSIONS == 8  # sizing reads the executor's rule:
    assert [llama_spare_streams(BackendConfig(kv_layout="split", n_seq_max=n)) for n in (7, 8)] == [0, 1]
    assert make_llama(kv_layout="split", n_seq_max=7)._ops.spare is None
    ex = make_llama(kv_layout="split", n_seq_max=8, n_ctx=8 * 256)
    assert ex._ops.spare == 8 and ex._ops.cells_per_session == 256  # each session's stream as without it


def test_a_refused_step_moves_no_session(make_llama: Callable[..., LlamaExecutor]) -> None:
    """A step refused (a turn past its stream's cells) exchanges no streams: every session stays
    where it was and goes on as a twin that never saw the step."""
    runs = []
    for refused in (True, False):
        ex = make_llama(kv_layout="split", n_seq_max=8, n_ctx=8 * 256)
        for i in range(8):
            ex.open_session(f"s{i}")
            ex.append(f"s{i}", PROMPT[i : 20 + i] * (12 if i == 6 else 1))
        if refused:
            with pytest.raises(ContextFullError):
                ex.append_many([("s1", [5]), ("s6", PROMPT[:40])])  # s6 holds 240 of its 256 cells
        runs.append(({sid: s.seq for sid, s in ex._sessions.items()}, [ex.generate(f"s{i}", 4) for i in range(8)]))
    assert runs[0] == runs[1] and runs[0][0]["s6"] == 6
