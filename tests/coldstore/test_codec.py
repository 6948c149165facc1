"""Block codec: bit-exact round trips, one typed error per kind of damage, no pickle."""

from __future__ import annotations

import pickle
import struct
import zlib

import msgpack
import numpy as np
import pytest

from kvres.coldstore import (
    FORMAT_VERSION,
    BlockChecksumError,
    BlockCorruptError,
    BlockEncodeError,
    BlockFingerprintError,
    BlockLengthError,
    BlockVersionError,
    ColdStoreError,
    InvalidSessionIdError,
    decode_block,
    encode_block,
    encoded_size,
)
from kvres.coldstore.codec import MAGIC, PREFIX_SIZE, decode_head, encode_head
from kvres.policy.errors import BlockMismatchError

from .helpers import FINGERPRINT, OTHER_FINGERPRINT, make_block, payload_of, seal

SIZES = [0, 1, 7, 4096, 64 << 10, 1 << 20, 16 << 20, 64 << 20]


@pytest.mark.parametrize("size", SIZES, ids=[f"{s}B" for s in SIZES])
def test_round_trip_is_bit_exact(size: int) -> None:
    payload = payload_of(size, seed=size)
    block = make_block(payload)
    data = encode_block(block)
    assert len(data) == encoded_size(block)
    out = decode_block(data, expected_fingerprint=FINGERPRINT)
    assert out.payload_nbytes == size
    assert out.payload == payload  # memoryview == bytes compares the bytes
    for name in ("fingerprint", "model_id", "engine", "type_k", "type_v", "geometry", "session_id",
                 "token_range", "token_ids", "positions", "meta"):
        assert getattr(out, name) == getattr(block, name), name


def test_decoded_payload_is_a_view_of_the_input() -> None:
    data = encode_block(make_block(payload_of(1 << 16)))
    out = decode_block(data)
    assert isinstance(out.payload, memoryview)
    assert out.payload.obj is data  # no copy of the payload


def test_numpy_and_non_byte_buffers_round_trip() -> None:
    arr = np.arange(1000, dtype=np.float16).reshape(10, 100)
    out = decode_block(encode_block(make_block(memoryview(arr))))
    assert np.array_equal(np.frombuffer(out.payload, dtype=np.float16).reshape(10, 100), arr)


def test_empty_positions_tokens_and_meta_round_trip() -> None:
    block = make_block(b"x", n_tokens=0, positions=False, meta={})
    out = decode_block(encode_block(block))
    assert out.token_ids == () and out.positions == () and out.meta == {}


def test_header_is_msgpack_not_pickle() -> None:
    data = encode_block(make_block(b"abc"))
    assert data[:8] == MAGIC
    header, offset = decode_head(data)
    raw = data[PREFIX_SIZE:offset]
    obj = msgpack.unpackb(raw, raw=False)
    assert obj["v"] == FORMAT_VERSION and obj["plen"] == 3 and obj["pcrc"] == zlib.crc32(b"abc").to_bytes(4, "big")
    assert b"pickle" not in data and b"\x80\x05" not in data[:PREFIX_SIZE]


# ---- damage ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def encoded() -> bytes:
    return encode_block(make_block(payload_of(4096, seed=3)))


def test_every_flipped_header_byte_is_a_corrupt_error(encoded: bytes) -> None:
    _, offset = decode_head(encoded)
    for i in range(offset):
        bad = bytearray(encoded)
        bad[i] ^= 0x40
        with pytest.raises(BlockCorruptError):
            decode_block(bytes(bad))


def test_flipped_header_body_byte_is_a_checksum_error(encoded: bytes) -> None:
    _, offset = decode_head(encoded)
    bad = bytearray(encoded)
    bad[(PREFIX_SIZE + offset) // 2] ^= 0x01
    with pytest.raises(BlockChecksumError, match="header checksum"):
        decode_block(bytes(bad))


@pytest.mark.parametrize("where", [0, 1, 2047, 4095])
def test_flipped_payload_byte_is_a_checksum_error(encoded: bytes, where: int) -> None:
    _, offset = decode_head(encoded)
    bad = bytearray(encoded)
    bad[offset + where] ^= 0x80
    with pytest.raises(BlockChecksumError, match="payload checksum"):
        decode_block(bytes(bad))


def test_every_truncation_is_a_length_error(encoded: bytes) -> None:
    for cut in [*range(0, 64), *range(64, len(encoded), 97), len(encoded) - 1]:
        with pytest.raises(BlockLengthError):
            decode_block(encoded[:cut])


@pytest.mark.parametrize("garbage", [b"\x00", b"trailing garbage", bytes(4096)])
def test_trailing_garbage_is_a_length_error(encoded: bytes, garbage: bytes) -> None:
    with pytest.raises(BlockLengthError, match="trailing"):
        decode_block(encoded + garbage)


@pytest.mark.parametrize("version", [0, FORMAT_VERSION + 1, 0xFFFF])
def test_wrong_version_is_a_version_error(encoded: bytes, version: int) -> None:
    bad = bytearray(encoded)
    struct.pack_into("<H", bad, 8, version)
    with pytest.raises(BlockVersionError, match=f"version {version}"):
        decode_block(bytes(bad))


def test_bad_magic_is_a_corrupt_error(encoded: bytes) -> None:
    with pytest.raises(BlockCorruptError, match="magic"):
        decode_block(b"NOTABLOC" + encoded[8:])


def _with_header(header: object, payload: bytes = b"") -> bytes:
    return seal(msgpack.packb(header, use_bin_type=True), payload)


def _header_of(data: bytes) -> dict[str, object]:
    _, offset = decode_head(data)
    return dict(msgpack.unpackb(data[PREFIX_SIZE:offset], raw=False))


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("v", 1, BlockVersionError),
        ("sid", "../etc", BlockCorruptError),
        ("sid", 5, BlockCorruptError),
        ("range", [5, 1], BlockCorruptError),
        ("range", [0], BlockCorruptError),
        ("geom", [0, 1, 1], BlockCorruptError),
        ("tokens", [1, 2], BlockCorruptError),  # 2 tokens for a 4-token range
        ("tokens", ["a", "b", "c", "d"], BlockCorruptError),
        ("pos", [True, 1, 2, 3], BlockCorruptError),
        ("meta", [1], BlockCorruptError),
        ("plen", -1, BlockCorruptError),
        ("plen", 3, BlockLengthError),
        ("pcrc", 12345, BlockCorruptError),
        ("fp", "a/b", BlockCorruptError),
    ],
)
def test_well_checksummed_but_invalid_headers_are_refused(
    encoded: bytes, field: str, value: object, error: type[Exception]
) -> None:
    header = _header_of(encoded)
    header[field] = value
    _, offset = decode_head(encoded)
    with pytest.raises(error):
        decode_block(_with_header(header, encoded[offset:]))


def test_missing_or_extra_header_keys_are_refused(encoded: bytes) -> None:
    header = _header_of(encoded)
    _, offset = decode_head(encoded)
    extra = {**header, "extra": 1}
    missing = {k: v for k, v in header.items() if k != "pcrc"}
    for bad in (extra, missing, [1, 2, 3], "text", None):
        with pytest.raises(BlockCorruptError):
            decode_block(_with_header(bad, encoded[offset:]))


def test_other_fingerprint_is_refused_with_a_fingerprint_error(encoded: bytes) -> None:
    with pytest.raises(BlockFingerprintError, match=OTHER_FINGERPRINT) as info:
        decode_block(encoded, expected_fingerprint=OTHER_FINGERPRINT)
    assert isinstance(info.value, (ColdStoreError, BlockMismatchError))


# ---- encode-side validation -----------------------------------------------------------------


def test_meta_msgpack_cannot_carry_is_an_encode_error() -> None:
    with pytest.raises(BlockEncodeError, match="meta"):
        encode_block(make_block(b"", meta={"obj": object()}))


def test_unsafe_session_id_is_refused_at_encode() -> None:
    with pytest.raises(InvalidSessionIdError, match=r"\.\./x"):
        encode_head(make_block(b"", session_id="../x"))


def test_unsafe_session_id_is_a_value_error_too() -> None:
    with pytest.raises(ValueError):
        encode_head(make_block(b"", session_id="a/b"))


# ---- pickling for Ray -------------------------------------------------------------------------


def test_protocol5_pickling_sends_the_payload_out_of_band() -> None:
    payload = payload_of(1 << 20)
    block = make_block(memoryview(payload))
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(block, protocol=5, buffer_callback=buffers.append)
    assert len(data) < 4096 and len(buffers) == 1
    out = pickle.loads(data, buffers=buffers)
    assert out.payload == payload and out.token_range == block.token_range
    in_band = pickle.loads(pickle.dumps(block, protocol=5))
    assert bytes(in_band.payload) == payload
    assert pickle.loads(pickle.dumps(block, protocol=4)).payload == payload
