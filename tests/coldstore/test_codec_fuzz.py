"""Fuzzing ``decode_block``: whatever the bytes, it returns a valid block or a ColdStoreError."""

from __future__ import annotations

import zlib

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvres.coldstore import ColdStoreError, KVBlock, decode_block, encode_block
from kvres.coldstore.codec import FORMAT_VERSION, MAGIC, PREFIX, PREFIX_SIZE, decode_head
from tests.hypothesis_profiles import examples

from .helpers import make_block, seal

FUZZ = settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
VALID = encode_block(make_block(bytes(range(256)) * 4))
_, VALID_OFFSET = decode_head(VALID)
VALID_HEADER = msgpack.unpackb(VALID[PREFIX_SIZE:VALID_OFFSET], raw=False)


def _decode_only_typed_errors(data: bytes) -> None:
    try:
        block = decode_block(data)
    except ColdStoreError:
        return
    assert isinstance(block, KVBlock)
    assert block.payload_nbytes == len(data) - decode_head(data)[1]


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes(data: bytes) -> None:
    _decode_only_typed_errors(data)


@FUZZ
@given(st.binary(max_size=256))
def test_random_bytes_after_a_valid_prefix(tail: bytes) -> None:
    _decode_only_typed_errors(MAGIC + tail)
    _decode_only_typed_errors(PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(tail), zlib.crc32(tail), b"") + tail)
    _decode_only_typed_errors(seal(tail))


@FUZZ
@given(
    st.lists(
        st.tuples(st.integers(0, len(VALID) - 1), st.integers(1, 255)), min_size=1, max_size=8
    )
)
def test_mutated_valid_block(flips: list[tuple[int, int]]) -> None:
    data = bytearray(VALID)
    for where, mask in flips:
        data[where] ^= mask
    _decode_only_typed_errors(bytes(data))


@FUZZ
@given(st.integers(0, len(VALID)), st.binary(max_size=64), st.integers(0, 64))
def test_spliced_valid_block(at: int, insert: bytes, delete: int) -> None:
    _decode_only_typed_errors(VALID[:at] + insert + VALID[at + delete:])


_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=True),
    st.text(max_size=20), st.binary(max_size=20),
)
_value = st.recursive(
    _leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=5), inner, max_size=5)),
    max_leaves=20,
)


@FUZZ
@given(st.dictionaries(st.sampled_from(sorted(VALID_HEADER)), _value, max_size=6), st.binary(max_size=64))
def test_well_checksummed_headers_with_random_fields(changes: dict[str, object], payload: bytes) -> None:
    """Headers whose checksum is right but whose fields are anything: schema validation must hold."""
    header = {**VALID_HEADER, **changes}
    _decode_only_typed_errors(seal(msgpack.packb(header, use_bin_type=True), payload))


@FUZZ
@given(_value)
def test_well_checksummed_arbitrary_msgpack(obj: object) -> None:
    _decode_only_typed_errors(seal(msgpack.packb(obj, use_bin_type=True)))
