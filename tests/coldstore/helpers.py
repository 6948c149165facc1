"""Block factories shared by the cold-store tests."""

from __future__ import annotations

import zlib
from typing import Any

import msgpack

from kvres.coldstore import KVBlock, KVGeometry, make_fingerprint
from kvres.coldstore.auth import block_tag
from kvres.coldstore.codec import FORMAT_VERSION, MAGIC, PREFIX_SIZE, SIGNED_PREFIX, TAG_OFFSET, decode_head
from kvres.policy.ranges import Range

GEOMETRY = KVGeometry(n_layers=2, n_kv_heads=2, head_dim=8)
FINGERPRINT = make_fingerprint("stories260K", "llama", "f16", "f16", GEOMETRY)
OTHER_FINGERPRINT = make_fingerprint("stories260K", "llama", "q8_0", "q8_0", GEOMETRY)


def make_block(
    payload: bytes | bytearray | memoryview = b"",
    *,
    session_id: str = "sess-1",
    start: int = 0,
    n_tokens: int = 4,
    fingerprint: str = FINGERPRINT,
    positions: bool = True,
    meta: dict[str, Any] | None = None,
) -> KVBlock:
    rng = Range(start, start + n_tokens)
    return KVBlock(
        fingerprint=fingerprint,
        model_id="stories260K",
        engine="llama",
        type_k="f16",
        type_v="f16",
        geometry=GEOMETRY,
        session_id=session_id,
        token_range=rng,
        token_ids=tuple(range(100 + start, 100 + start + n_tokens)),
        payload=payload,
        positions=tuple(range(rng.start, rng.end)) if positions else (),
        meta={"layer_order": "kv", "n": 1} if meta is None else meta,
    )


def payload_of(size: int, seed: int = 0) -> bytes:
    """Deterministic, non-repeating-looking bytes of ``size`` (fast for big sizes)."""
    import numpy as np

    return np.random.default_rng(seed).integers(0, 256, size=size, dtype=np.uint8).tobytes()


def seal(raw_header: bytes, payload: bytes = b"", secret: bytes | None = None,
         version: int = FORMAT_VERSION) -> bytes:
    """An encoded block around any header bytes, with right checksum and tag: what a writer who
    holds ``secret`` would make (for tests of what lies past the prefix checks)."""
    lead = SIGNED_PREFIX.pack(MAGIC, version, 0, len(raw_header), zlib.crc32(raw_header))
    return lead + block_tag(secret, payload, lead, raw_header) + raw_header + payload


def forge(data: bytes, *, flip_payload_at: int | None = None, **fields: object) -> bytes:
    """What someone without the secret can make of an encoded block: payload bytes or header
    fields changed, every checksum recomputed, the genuine block's tag kept."""
    _, offset = decode_head(data)
    header = dict(msgpack.unpackb(data[PREFIX_SIZE:offset], raw=False), **fields)
    payload = bytearray(data[offset:])
    if flip_payload_at is not None:
        payload[flip_payload_at] ^= 0x5A
    header["pcrc"] = zlib.crc32(payload).to_bytes(4, "big")
    forged = bytearray(seal(msgpack.packb(header, use_bin_type=True), bytes(payload)))
    forged[TAG_OFFSET:PREFIX_SIZE] = data[TAG_OFFSET:PREFIX_SIZE]
    return bytes(forged)
