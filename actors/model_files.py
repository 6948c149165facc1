"""Model files on disk: the one GGUF metadata reader and the one model identity.

Primitives:
- ``model_id(path) -> str``: ``"sha256:<hex>"`` of the whole file, computed once per (path, size,
  mtime) in a process. Every engine, block fingerprint and probe cache names a model by it.
- ``check_gguf_file(path)``: a typed ``ModelLoadError`` unless ``path`` is a file starting with
  the GGUF magic.
- ``open_gguf(path)``: a ``gguf.GGUFReader`` over a checked file (tensors for the converters).
- ``gguf_value(reader, key, default=None)``: one metadata value (strings decoded, arrays as lists).
- ``read_gguf_metadata(path) -> dict``: every key/value of a GGUF file except the tokenizer's.
- ``layout_from_gguf(path) -> ModelKVLayout``: which layers own KV, their widths and windows, as
  llama.cpp builds them (``kvres.policy.kv_layout``).
- ``profile_from_gguf(path, type_k, type_v) -> LayerKVProfile``: the T0 profile of a GGUF model.
- ``tensor_bytes(path) -> dict[str, int]``: the stored size of every tensor.
- ``active_weight_bytes_of(path) -> float``: the weights one decode step reads
  (``kvres.policy.tiering.active_weight_bytes``).
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any

from kvres.policy.capacity import CapacityError, LayerKVProfile
from kvres.policy.errors import ModelLoadError
from kvres.policy.kv_layout import ModelKVLayout, layout_from_metadata

GGUF_MAGIC = b"GGUF"
_digests: dict[tuple[str, int, int], str] = {}
_digest_lock = threading.Lock()


def model_id(path: str | os.PathLike[str]) -> str:
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise ModelLoadError(f"model file not found: {os.fspath(path)!r} ({exc.strerror})") from None
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    with _digest_lock:
        cached = _digests.get(key)
    if cached is None:
        digest = hashlib.sha256()
        with p.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                digest.update(chunk)
        cached = f"sha256:{digest.hexdigest()}"
        with _digest_lock:
            _digests[key] = cached
    return cached


def check_gguf_file(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    if not p.is_file():
        raise ModelLoadError(f"model file not found: {os.fspath(path)!r}")
    with p.open("rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise ModelLoadError(
            f"not a GGUF model file: {os.fspath(path)!r} (starts with {magic!r}, expected {GGUF_MAGIC!r})"
        )
    return p


def open_gguf(path: str | os.PathLike[str]) -> Any:
    p = check_gguf_file(path)
    from gguf import GGUFReader

    try:
        return GGUFReader(str(p))
    except Exception as exc:  # the reader raises assorted errors on damaged files
        raise ModelLoadError(f"cannot read GGUF file {str(p)!r}: {exc}") from exc


def gguf_value(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def read_gguf_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    reader = open_gguf(path)
    return {key: gguf_value(reader, key) for key in reader.fields if not key.startswith("tokenizer.")}


def layout_from_gguf(path: str | os.PathLike[str]) -> ModelKVLayout:
    meta = read_gguf_metadata(path)
    try:
        return layout_from_metadata(meta)
    except CapacityError as exc:
        raise ModelLoadError(f"cannot read the KV layout of {os.fspath(path)!r}: {exc}") from exc


def profile_from_gguf(
    path: str | os.PathLike[str], type_k: str = "f16", type_v: str = "f16"
) -> LayerKVProfile:
    return layout_from_gguf(path).profile(type_k, type_v)


def tensor_bytes(path: str | os.PathLike[str]) -> dict[str, int]:
    reader = open_gguf(path)
    return {str(t.name): int(t.n_bytes) for t in reader.tensors}


def active_weight_bytes_of(path: str | os.PathLike[str]) -> float:
    from kvres.policy.tiering import active_weight_bytes

    meta = read_gguf_metadata(path)
    arch = str(meta.get("general.architecture", ""))
    return active_weight_bytes(
        tensor_bytes(path),
        n_expert=int(meta.get(f"{arch}.expert_count") or 0),
        n_expert_used=int(meta.get(f"{arch}.expert_used_count") or 0),
    )
