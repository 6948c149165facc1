"""Block codec: a fixed prefix with an HMAC tag, a msgpack header and the raw payload; never pickle.

Primitives:
- ``encode_block(block, secret=None) -> bytes``: the whole encoded block (one concatenation copy).
- ``encode_head(block, payload_crc=None, secret=None) -> bytes``: prefix + header only, for writers
  that send the payload separately and so never copy it. ``head_size(block)`` is its length, which
  depends on neither the checksum nor the tag, so a writer may place the payload first and the
  header once both (computed while the device writes the payload back) are known.
- ``decode_block(data, expected_fingerprint=None, secret=None) -> KVBlock``: validates everything;
  the payload of the result is a zero-copy ``memoryview`` slice of ``data``.
- ``decode_head(data) -> (BlockHeader, payload_offset)`` and ``block_from_parts(header, payload,
  secret=None)``: the same validation in two steps, for readers that read the header before the
  payload; the tag is checked in the second, once the payload is there.
- ``head_length(prefix) -> int``: validates the fixed prefix and returns prefix + header size.
- ``encoded_size(block) -> int``.

Layout (little endian)::

    offset 0   8 bytes  magic  b"KVRESBLK"
           8   u16      format version (FORMAT_VERSION, 2)
          10   u16      reserved, 0
          12   u32      header length H
          16   u32      crc32 of the header bytes
          20   32 bytes tag: HMAC-SHA256 under the store's secret of the payload's length (u64),
                        the payload, bytes [0, 20) and the header (every byte of the block but
                        the tag's own; the payload first, so a writer can start the tag while it
                        computes the payload's checksum)
          52   H bytes  msgpack map: v, fp, model_id, engine, type_k, type_v, geom [L, heads, dim],
                        sid, range [start, end], tokens, pos, meta, plen, pcrc (4 bytes, big
                        endian crc32 of the payload)
        52+H   plen     payload

The header checksum is verified before msgpack parses anything; the tag before the block is
returned. A tag that verifies proves header and payload intact, so the payload checksum is
computed only when it does not, to tell damage (``BlockChecksumError``) from tampering: bytes
whose checksums are right but whose tag does not verify under the secret were altered on purpose,
forged, or written under another secret (``BlockAuthError``). Every failure is
a ``BlockCorruptError`` subclass (``BlockVersionError``, ``BlockLengthError``,
``BlockChecksumError``, ``BlockAuthError``) or, when the caller names a fingerprint the block does
not have, ``BlockFingerprintError``. Version 1 blocks (no tag) are refused with a
``BlockVersionError``: their owners recompute them from the token log.

``secret=None`` keys the tag with the empty key (``auth.UNKEYED``): integrity without
authentication, for stores used outside a cluster.
"""

from __future__ import annotations

import hmac
import struct
import zlib
from dataclasses import dataclass, replace

import msgpack

from kvres.policy.ranges import Range

from .auth import TAG_BYTES, block_tag, check_secret, finish_tag, payload_mac, tags_equal
from .block import KVBlock, KVGeometry
from .errors import (
    BlockAuthError,
    BlockChecksumError,
    BlockCorruptError,
    BlockEncodeError,
    BlockLengthError,
    BlockVersionError,
    ColdStoreError,
)
from .keys import validate_fingerprint, validate_session_id

MAGIC = b"KVRESBLK"
FORMAT_VERSION = 2
LEAD = struct.Struct("<8sH")  # magic and version: where every format version has them
PREFIX = struct.Struct(f"<8sHHII{TAG_BYTES}s")
PREFIX_SIZE = PREFIX.size  # 52
SIGNED_PREFIX = struct.Struct("<8sHHII")  # the prefix up to the tag
TAG_OFFSET = SIGNED_PREFIX.size  # 20: the tag covers every byte before and after it
MAX_HEADER_BYTES = 64 << 20
MAX_STR_LEN = 1024

_HEADER_KEYS = frozenset(
    {"v", "fp", "model_id", "engine", "type_k", "type_v", "geom", "sid", "range", "tokens", "pos",
     "meta", "plen", "pcrc"}
)


@dataclass(frozen=True)
class BlockHeader:
    """A decoded, validated header: the block's fields (``block``, with an empty payload) and what
    the payload must be (``payload_len`` bytes with CRC ``payload_crc``); the payload is not read.
    ``signed`` holds the bytes before the payload that the tag covers, ``tag`` the stored tag."""

    block: KVBlock
    payload_len: int
    payload_crc: int
    signed: bytes = b""
    tag: bytes = b""

    @property
    def session_id(self) -> str:
        return self.block.session_id

    @property
    def token_range(self) -> Range:
        return self.block.token_range

    @property
    def fingerprint(self) -> str:
        return self.block.fingerprint


def payload_view(payload: bytes | bytearray | memoryview) -> memoryview:
    """A flat byte view of ``payload`` (no copy)."""
    view = memoryview(payload)
    if view.format != "B" or view.ndim != 1:
        try:
            view = view.cast("B")
        except TypeError as exc:
            raise BlockEncodeError(f"payload must be a C-contiguous buffer, got {view!r}") from exc
    return view


def _pack_header(block: KVBlock, payload: memoryview, payload_crc: int | None) -> bytes:
    validate_session_id(block.session_id)
    validate_fingerprint(block.fingerprint)
    for name in ("model_id", "engine", "type_k", "type_v"):
        value = getattr(block, name)
        if not isinstance(value, str) or len(value) > MAX_STR_LEN:
            raise BlockEncodeError(
                f"KVBlock.{name} must be a str of at most {MAX_STR_LEN} characters, got {value!r:.80}"
            )
    if payload_crc is not None and not 0 <= payload_crc < 1 << 32:
        raise BlockEncodeError(f"payload_crc must be a crc32 in [0, 2**32), got {payload_crc}")
    geom = block.geometry
    header = {
        "v": FORMAT_VERSION,
        "fp": block.fingerprint,
        "model_id": block.model_id,
        "engine": block.engine,
        "type_k": block.type_k,
        "type_v": block.type_v,
        "geom": [geom.n_layers, geom.n_kv_heads, geom.head_dim],
        "sid": block.session_id,
        "range": [block.token_range.start, block.token_range.end],
        "tokens": list(block.token_ids),
        "pos": list(block.positions),
        "meta": block.meta,
        "plen": payload.nbytes,
        "pcrc": (zlib.crc32(payload) if payload_crc is None else payload_crc).to_bytes(4, "big"),
    }
    try:
        packed: bytes = msgpack.packb(header, use_bin_type=True, strict_types=False)
    except (TypeError, ValueError, OverflowError) as exc:
        raise BlockEncodeError(
            f"block {block.session_id!r} {block.token_range}: header cannot be encoded with msgpack "
            f"({exc}); meta must hold only str/int/float/bool/None/bytes/list/dict"
        ) from exc
    if len(packed) > MAX_HEADER_BYTES:
        raise BlockEncodeError(
            f"block {block.session_id!r} {block.token_range}: header is {len(packed)} bytes, "
            f"the limit is {MAX_HEADER_BYTES}"
        )
    return packed


def encode_head(
    block: KVBlock, payload_crc: int | None = None, secret: bytes | None = None,
    payload_tag: hmac.HMAC | None = None,
) -> bytes:
    """Prefix (with the tag under ``secret``) + msgpack header of ``block``; the payload goes
    right after it.

    ``payload_crc`` is ``zlib.crc32`` of the payload and ``payload_tag`` its
    ``auth.payload_mac(secret, payload)`` when the caller has them (both may be computed at once,
    in two threads); otherwise they are computed here from ``block.payload``.
    """
    key = check_secret(secret)
    payload = payload_view(block.payload)
    packed = _pack_header(block, payload, payload_crc)
    lead = SIGNED_PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(packed), zlib.crc32(packed))
    mac = payload_mac(key, payload) if payload_tag is None else payload_tag
    return b"".join((lead, finish_tag(mac, lead, packed), packed))


def head_size(block: KVBlock) -> int:
    """Bytes of ``encode_head(block)`` whatever the checksum and tag (validates the header)."""
    return PREFIX_SIZE + len(_pack_header(block, payload_view(block.payload), 0))


def encoded_size(block: KVBlock) -> int:
    """Bytes ``encode_block(block)`` produces."""
    return head_size(block) + block.payload_nbytes


def encode_block(block: KVBlock, secret: bytes | None = None) -> bytes:
    """The encoded block: prefix with its tag, msgpack header, raw payload."""
    return b"".join((encode_head(block, secret=secret), payload_view(block.payload)))


def _read_prefix(view: memoryview) -> tuple[int, int, bytes]:
    """Validate the fixed prefix; return (header length, header crc, tag)."""
    if view.nbytes < LEAD.size:
        raise BlockLengthError(
            f"block truncated: {view.nbytes} bytes, the fixed prefix alone needs {PREFIX_SIZE}"
        )
    magic, version = LEAD.unpack_from(view, 0)
    if magic != MAGIC:
        raise BlockCorruptError(f"not a kvres block: magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise BlockVersionError(
            f"block format version {version} is not supported; this build reads version "
            f"{FORMAT_VERSION} (authenticated blocks) only, so the block is refused and its owner "
            "recomputes it"
        )
    if view.nbytes < PREFIX_SIZE:
        raise BlockLengthError(
            f"block truncated: {view.nbytes} bytes, the fixed prefix alone needs {PREFIX_SIZE}"
        )
    _, _, reserved, header_len, header_crc, tag = PREFIX.unpack_from(view, 0)
    if reserved != 0:
        raise BlockCorruptError(f"reserved prefix field is {reserved}, expected 0")
    if header_len > MAX_HEADER_BYTES:
        raise BlockCorruptError(f"header length {header_len} exceeds the limit {MAX_HEADER_BYTES}")
    return int(header_len), int(header_crc), bytes(tag)


def head_length(prefix: bytes | bytearray | memoryview) -> int:
    """Bytes of prefix + header, from the first ``PREFIX_SIZE`` bytes of an encoded block."""
    header_len, _, _ = _read_prefix(payload_view(prefix))
    return PREFIX_SIZE + header_len


def _expect(cond: bool, what: str, value: object) -> None:
    if not cond:
        raise BlockCorruptError(f"bad header field {what}: {value!r:.120}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_tuple(value: object, what: str) -> tuple[int, ...]:
    _expect(isinstance(value, list), what, value)
    assert isinstance(value, list)
    for item in value:
        _expect(_is_int(item), what, item)
    return tuple(value)


def _parse_header(raw: memoryview) -> BlockHeader:
    try:
        obj = msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises many types on malformed input
        raise BlockCorruptError(f"header is not valid msgpack: {exc}") from exc
    _expect(isinstance(obj, dict), "header", type(obj).__name__)
    assert isinstance(obj, dict)
    if set(obj) != _HEADER_KEYS:
        raise BlockCorruptError(
            f"header keys {sorted(map(str, obj))} differ from the expected {sorted(_HEADER_KEYS)}"
        )
    if obj["v"] != FORMAT_VERSION:
        raise BlockVersionError(
            f"header format version {obj['v']!r} is not supported; this build reads {FORMAT_VERSION}"
        )
    for name in ("fp", "model_id", "engine", "type_k", "type_v", "sid"):
        _expect(isinstance(obj[name], str) and len(obj[name]) <= MAX_STR_LEN, name, obj[name])
    geom = _int_tuple(obj["geom"], "geom")
    rng = _int_tuple(obj["range"], "range")
    _expect(len(geom) == 3, "geom", geom)
    _expect(len(rng) == 2, "range", rng)
    _expect(isinstance(obj["meta"], dict), "meta", obj["meta"])
    _expect(_is_int(obj["plen"]) and obj["plen"] >= 0, "plen", obj["plen"])
    _expect(isinstance(obj["pcrc"], bytes) and len(obj["pcrc"]) == 4, "pcrc", obj["pcrc"])
    try:
        validate_session_id(obj["sid"])
        validate_fingerprint(obj["fp"])
        block = KVBlock(
            fingerprint=obj["fp"], model_id=obj["model_id"], engine=obj["engine"],
            type_k=obj["type_k"], type_v=obj["type_v"], geometry=KVGeometry(*geom),
            session_id=obj["sid"], token_range=Range(*rng), token_ids=_int_tuple(obj["tokens"], "tokens"),
            payload=b"", positions=_int_tuple(obj["pos"], "pos"), meta=obj["meta"],
        )
        return BlockHeader(block, obj["plen"], int.from_bytes(obj["pcrc"], "big"))
    except BlockCorruptError:
        raise
    except (ColdStoreError, ValueError, TypeError) as exc:
        raise BlockCorruptError(f"header fields are inconsistent: {exc}") from exc


def decode_head(data: bytes | bytearray | memoryview) -> tuple[BlockHeader, int]:
    """Validate prefix and header at the start of ``data``; return the header and payload offset.

    ``data`` may hold only the prefix and header (the payload is not inspected).
    """
    view = payload_view(data)
    header_len, header_crc, tag = _read_prefix(view)
    end = PREFIX_SIZE + header_len
    if view.nbytes < end:
        raise BlockLengthError(
            f"block truncated: {view.nbytes} bytes, prefix + header need {end}"
        )
    raw = view[PREFIX_SIZE:end]
    if zlib.crc32(raw) != header_crc:
        raise BlockChecksumError(
            f"header checksum mismatch: stored {header_crc:#010x}, computed {zlib.crc32(raw):#010x}"
        )
    header = _parse_header(raw)
    return replace(header, signed=bytes(view[:TAG_OFFSET]) + bytes(raw), tag=tag), end


def block_from_parts(
    header: BlockHeader, payload: bytes | bytearray | memoryview, secret: bytes | None = None
) -> KVBlock:
    """A ``KVBlock`` from a validated header and its payload; checks length, checksum and tag."""
    key = check_secret(secret)
    view = payload_view(payload)
    if view.nbytes != header.payload_len:
        raise BlockLengthError(
            f"payload of {header.session_id!r} {header.token_range} is {view.nbytes} bytes, "
            f"header says {header.payload_len}"
        )
    if tags_equal(block_tag(key, view, header.signed), header.tag):
        return replace(header.block, payload=payload if isinstance(payload, (bytes, bytearray)) else view)
    # The tag alone proves the bytes intact; the checksum only tells damage from tampering.
    crc = zlib.crc32(view)
    if crc != header.payload_crc:
        raise BlockChecksumError(
            f"payload checksum mismatch for {header.session_id!r} {header.token_range}: stored "
            f"{header.payload_crc:#010x}, computed {crc:#010x}"
        )
    raise BlockAuthError(
        f"block {header.session_id!r} {header.token_range} fails authentication: its checksums "
        "are right but its HMAC tag does not verify under this store's secret (altered, forged "
        "or written under another secret); it is refused and its owner recomputes it"
    )


def decode_block(
    data: bytes | bytearray | memoryview, expected_fingerprint: str | None = None,
    secret: bytes | None = None,
) -> KVBlock:
    """Decode and validate one encoded block; the payload is a zero-copy view of ``data``.

    Raises a ``BlockCorruptError`` subclass for damaged or unauthenticated bytes, and
    ``BlockFingerprintError`` when ``expected_fingerprint`` is given and the block has another.
    """
    view = payload_view(data)
    header, offset = decode_head(view)
    expected_total = offset + header.payload_len
    if view.nbytes != expected_total:
        kind = "truncated" if view.nbytes < expected_total else "followed by trailing bytes"
        raise BlockLengthError(
            f"block {header.session_id!r} {header.token_range} is {kind}: {view.nbytes} bytes, "
            f"header + payload need exactly {expected_total}"
        )
    block = block_from_parts(header, view[offset:], secret)
    if expected_fingerprint is not None:
        block.check_fingerprint(expected_fingerprint)
    return block
