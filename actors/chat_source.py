"""What a model file says about chat: its template and its special tokens (the host renders the template).

Primitives:
- ``ChatTemplateSource(template, bos_token, eos_token, bos_id, eos_id, add_bos)``: frozen; the GGUF's
  ``tokenizer.chat_template``, the BOS / EOS tokens' texts and ids (``""`` / None where the model
  has none) and ``add_bos`` (``tokenizer.ggml.add_bos_token``; when absent, True for a
  SentencePiece ("llama") vocabulary, as llama.cpp decides).
- ``read_chat_template(path) -> ChatTemplateSource | None``: from a GGUF file, read with
  ``kvres.actors.model_files`` (only the two token texts it needs are decoded; kept per file size
  and mtime); None where the file has no template.
- ``tokenizer_meta(path) -> dict``: a GGUF's ``tokenizer.ggml.*`` fields, keyed without that prefix.
- ``eog_ids(tokenizer_meta) -> frozenset[int]``: the end-of-generation ids a GGUF's
  ``tokenizer.ggml.*`` fields name (eos, eot and eom ids), for engines without llama.cpp's vocabulary.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvres.actors.model_files import gguf_value, open_gguf

EOG_KEYS = ("eos_token_id", "eot_token_id", "eom_token_id")


@dataclass(frozen=True)
class ChatTemplateSource:
    template: str
    bos_token: str
    eos_token: str
    bos_id: int | None
    eos_id: int | None
    add_bos: bool


def _token_text(reader: Any, token: int | None) -> str:
    field = reader.fields.get("tokenizer.ggml.tokens")
    if token is None or field is None or not 0 <= token < len(field.data):
        return ""
    return bytes(field.parts[field.data[token]]).decode("utf-8", "replace")


def read_chat_template(path: str | os.PathLike[str]) -> ChatTemplateSource | None:
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        return _read_chat_template(str(p), 0, 0)  # open_gguf names the missing file
    return _read_chat_template(str(p.resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _read_chat_template(path: str, _size: int, _mtime_ns: int) -> ChatTemplateSource | None:
    reader = open_gguf(path)
    template = gguf_value(reader, "tokenizer.chat_template")
    if not template:
        return None
    bos, eos = gguf_value(reader, "tokenizer.ggml.bos_token_id"), gguf_value(reader, "tokenizer.ggml.eos_token_id")
    bos_id, eos_id = (int(bos) if bos is not None else None), (int(eos) if eos is not None else None)
    add_bos = gguf_value(reader, "tokenizer.ggml.add_bos_token")
    if add_bos is None:
        add_bos = gguf_value(reader, "tokenizer.ggml.model") == "llama"
    return ChatTemplateSource(str(template), _token_text(reader, bos_id), _token_text(reader, eos_id),
                              bos_id, eos_id, bool(add_bos))


def eog_ids(tokenizer_meta: Mapping[str, Any] | None) -> frozenset[int]:
    meta = tokenizer_meta or {}
    return frozenset(int(meta[k]) for k in EOG_KEYS if meta.get(k) is not None)


def tokenizer_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    reader = open_gguf(path)
    return {key.removeprefix("tokenizer.ggml."): gguf_value(reader, key)
            for key in reader.fields if key.startswith("tokenizer.ggml.")}
