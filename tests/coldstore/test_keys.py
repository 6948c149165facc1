"""Session ids and keys: nothing that could escape the store's directory is accepted."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvres.coldstore import (
    MAX_SESSION_ID_LEN,
    BlockKey,
    DiskTier,
    InvalidKeyError,
    InvalidSessionIdError,
    validate_fingerprint,
    validate_session_id,
)
from kvres.policy.ranges import Range
from tests.hypothesis_profiles import examples

from .helpers import FINGERPRINT, make_block

GOOD = ["a", "sess-1", "S_2.v3", "0", "x" * MAX_SESSION_ID_LEN, "550e8400-e29b-41d4-a716-446655440000"]
BAD = [
    "", ".", "..", "../x", "a/../../b", "/etc/passwd", "a/b", "a\\b", ".hidden", "a\x00b", "a b",
    "sess\n", "ünï", "x" * (MAX_SESSION_ID_LEN + 1), "C:", "~root",
]


@pytest.mark.parametrize("session_id", GOOD)
def test_safe_session_ids_pass(session_id: str) -> None:
    assert validate_session_id(session_id) == session_id


@pytest.mark.parametrize("session_id", BAD)
def test_unsafe_session_ids_are_refused(session_id: str) -> None:
    with pytest.raises(InvalidSessionIdError) as info:
        validate_session_id(session_id)
    assert isinstance(info.value, ValueError)


def test_errors_name_the_value_and_the_limit() -> None:
    with pytest.raises(InvalidSessionIdError, match=r"'\.\./x'.*no traversal"):
        validate_session_id("../x")
    with pytest.raises(InvalidSessionIdError, match=f"{MAX_SESSION_ID_LEN + 1} characters.*{MAX_SESSION_ID_LEN}"):
        validate_session_id("y" * (MAX_SESSION_ID_LEN + 1))
    with pytest.raises(InvalidSessionIdError, match="int"):
        validate_session_id(7)


@pytest.mark.parametrize("fingerprint", ["", "a.b", "a/b", "..", "f" * 129, "ab cd"])
def test_unsafe_fingerprints_are_refused(fingerprint: str) -> None:
    with pytest.raises(InvalidKeyError):
        validate_fingerprint(fingerprint)


def test_block_key_validates_all_parts() -> None:
    key = BlockKey("s", Range(0, 4), FINGERPRINT)
    assert key == BlockKey.of(make_block(b"", session_id="s"))
    with pytest.raises(InvalidSessionIdError):
        BlockKey("../s", Range(0, 4), FINGERPRINT)
    with pytest.raises(InvalidKeyError):
        BlockKey("s", Range(0, 4), "../../fp")
    with pytest.raises(InvalidKeyError):
        BlockKey("s", (0, 4), FINGERPRINT)  # type: ignore[arg-type]


def test_disk_tier_refuses_traversal(tmp_path: Path) -> None:
    with DiskTier(tmp_path / "store", 1 << 20) as disk:
        for session_id in ("../escape", "/abs", "a/b"):
            with pytest.raises(InvalidSessionIdError):
                disk.put(make_block(b"x", session_id=session_id))
            with pytest.raises(InvalidSessionIdError):
                disk.drop_session(session_id)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


@settings(max_examples=examples(200), deadline=None)
@given(st.text(max_size=140))
def test_any_accepted_id_is_one_plain_path_component(session_id: str) -> None:
    try:
        validate_session_id(session_id)
    except InvalidSessionIdError:
        return
    root = Path("/store/blocks")
    resolved = (root / session_id).resolve()
    assert resolved.parent == root and resolved.name == session_id
    assert not session_id.startswith(".") and "/" not in session_id and "\\" not in session_id


@given(st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True), st.integers(0, 10_000), st.integers(1, 64))
def test_block_keys_hash_and_compare_by_value_across_pickling(session_id: str, start: int, n: int) -> None:
    key = BlockKey(session_id, Range(start, start + n), "fp")
    twin = pickle.loads(pickle.dumps(key))
    assert twin == key and hash(twin) == hash(key) and {key: 1}[twin] == 1
    assert copy.deepcopy(key) == key and dataclasses.replace(key) == key
    others = (BlockKey(session_id + "x", key.token_range, "fp"), BlockKey(session_id, Range(start, start + n + 1), "fp"),
              BlockKey(session_id, key.token_range, "fp2"))
    for other in others:
        assert other != key
    assert key != (session_id, start, start + n, "fp")  # not equal to its own parts
    assert sorted([BlockKey(session_id, Range(start + 1, start + n + 1), "fp"), key])[0] == key
