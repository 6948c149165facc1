"""Block authentication: an HMAC tag under the store's secret; a block altered with its checksums
recomputed, forged, or written under another secret is refused; version 1 blocks are refused."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import msgpack
import pytest

from kvres.coldstore import (
    BlockAuthError,
    BlockChecksumError,
    BlockCorruptError,
    BlockKey,
    BlockVersionError,
    ColdStoreError,
    DiskTier,
    InvalidSecretError,
    TieredStore,
    decode_block,
    encode_block,
    new_secret,
)
from kvres.coldstore.codec import MAGIC, PREFIX_SIZE, decode_head

from .helpers import forge, make_block, payload_of

SECRET = new_secret()
OTHER = new_secret()


def _header(data: bytes) -> dict[str, object]:
    _, offset = decode_head(data)
    return dict(msgpack.unpackb(data[PREFIX_SIZE:offset], raw=False))


def test_round_trip_under_a_secret_and_refused_under_another() -> None:
    block = make_block(payload_of(4096))
    data = encode_block(block, SECRET)
    assert bytes(decode_block(data, secret=SECRET).payload) == bytes(block.payload)
    for wrong in (OTHER, None):
        with pytest.raises(BlockAuthError, match="does not verify"):
            decode_block(data, secret=wrong)
    with pytest.raises(BlockAuthError):
        decode_block(encode_block(block), secret=SECRET)  # unkeyed block, keyed reader


def test_altered_payload_with_valid_checksums_is_refused() -> None:
    data = encode_block(make_block(payload_of(4096, seed=1)), SECRET)
    forged = forge(data, flip_payload_at=100)  # altered KV
    decode_head(forged)  # checksums hold: only the tag tells
    with pytest.raises(BlockAuthError):
        decode_block(forged, secret=SECRET)


def test_altered_header_fields_with_valid_checksums_are_refused() -> None:
    data = encode_block(make_block(payload_of(256)), SECRET)
    for field, value in (("tokens", [7, 7, 7, 7]), ("pos", [10, 11, 12, 13]), ("meta", {})):
        forged = forge(data, **{field: value})
        with pytest.raises(BlockAuthError):
            decode_block(forged, secret=SECRET)


def test_plain_damage_is_still_a_checksum_error() -> None:
    data = bytearray(encode_block(make_block(payload_of(4096)), SECRET))
    data[-1] ^= 1
    with pytest.raises(BlockChecksumError):
        decode_block(bytes(data), secret=SECRET)


def test_a_version_1_block_is_refused_with_a_version_error() -> None:
    raw = msgpack.packb({**_header(encode_block(make_block(b"abc"))), "v": 1}, use_bin_type=True)
    v1 = struct.pack("<8sHHII", MAGIC, 1, 0, len(raw), zlib.crc32(raw)) + raw + b"abc"
    with pytest.raises(BlockVersionError, match=r"version 1 is not supported.*version 2"):
        decode_block(v1, secret=SECRET)


@pytest.mark.parametrize("secret", [b"short", "a string of 32 characters, not b", 12345, bytes(15)])
def test_unusable_secrets_are_typed_errors_that_do_not_show_them(secret: object) -> None:
    with pytest.raises(InvalidSecretError) as info:
        encode_block(make_block(b"x"), secret)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError) and str(secret) not in str(info.value)


@pytest.mark.parametrize("size", [4096, 3 << 20], ids=["small", "overlapped-write"])
def test_disk_tier_refuses_a_forged_file_and_deletes_it(tmp_path: Path, size: int) -> None:
    block = make_block(payload_of(size, seed=size), session_id="victim")
    key = BlockKey.of(block)
    with DiskTier(tmp_path / "store", 64 << 20, secret=SECRET) as disk:
        disk.put(block)
        path = disk.file_path(key)
        data = path.read_bytes()
        assert bytes(decode_block(data, secret=SECRET).payload) == bytes(block.payload)
        path.write_bytes(forge(data, flip_payload_at=size // 2))
        with pytest.raises(BlockAuthError):
            disk.get(key)
        assert not path.exists() and key not in disk


def test_a_store_reopened_under_another_secret_refuses_its_old_blocks(tmp_path: Path) -> None:
    block = make_block(payload_of(4096), session_id="s")
    store = TieredStore.open(0, tmp_path / "store", 1 << 20, secret=SECRET)
    store.put(block)  # RAM budget 0: straight to disk
    store.close()
    reopened = TieredStore.open(0, tmp_path / "store", 1 << 20, secret=OTHER)
    assert reopened.get_many([BlockKey.of(block)]) == [None]  # refused: the owner recomputes
    assert reopened.stats().corrupt == 1 and not reopened.list_session("s")
    reopened.close()
    assert issubclass(BlockAuthError, BlockCorruptError) and issubclass(BlockAuthError, ColdStoreError)
