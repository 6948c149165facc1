"""Text <-> token ids for the OpenVINO executor, with OpenVINO tokenizer models (no llama.cpp).

Primitives:
- ``TextCodec.from_gguf_meta(meta)``: tokenizer / detokenizer built from a GGUF's SentencePiece
  vocabulary (``genai_tokenizer.build_tokenizer_models``); ``TextCodec.from_dir(folder, meta=None)``:
  the ``openvino_tokenizer.xml`` / ``openvino_detokenizer.xml`` of a genai model folder (``meta``,
  the GGUF's ``tokenizer.ggml.*`` fields, names its control tokens).
- ``tokenize(text, add_bos=True, special=False) -> list[int]``, ``detokenize(tokens, special=False)
  -> str``; ``bos_id``, ``eos_id``.
Raises ``CapabilityError`` naming the folder when it holds no tokenizer models.

Control tokens (GGUF token type 3), as llama.cpp treats them: ``special=True`` tokenizing splits the
text at their texts (longest first) and tokenizes the text between them on its own (so it gets the
vocabulary's space prefix, if any, as llama.cpp gives text after a special token); ``special=True``
detokenizing renders them as their text, the other runs through the detokenizer, each run after
the first keeping its leading space. Without a vocabulary there are no control tokens to handle.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov

from kvres.policy.errors import CapabilityError

from .genai_tokenizer import build_tokenizer_models

TOKENIZER_XML = "openvino_tokenizer.xml"
DETOKENIZER_XML = "openvino_detokenizer.xml"


CONTROL = 3  # gguf.TokenType.CONTROL


def _id(meta: Mapping[str, Any] | None, key: str) -> int | None:
    value = (meta or {}).get(key)
    return int(value) if value is not None else None


class TextCodec:
    def __init__(self, tokenizer: ov.Model, detokenizer: ov.Model, bos_id: int | None, bos_included: bool,
                 meta: Mapping[str, Any] | None = None) -> None:
        core = ov.Core()
        self._tok = core.compile_model(tokenizer, "CPU")
        self._detok = core.compile_model(detokenizer, "CPU")
        self.bos_id = bos_id
        eos = tokenizer.get_rt_info("eos_token_id").astype(int) if tokenizer.has_rt_info("eos_token_id") else None
        self.eos_id = _id(meta, "eos_token_id") if eos is None else int(eos)
        self._bos_included = bos_included
        tokens, types = (meta or {}).get("tokens") or [], (meta or {}).get("token_type") or []
        self._control = {i: str(tokens[i]) for i, t in enumerate(types) if int(t) == CONTROL and tokens[i]}
        self._spaced = {i for i, piece in enumerate(tokens) if str(piece).startswith("\u2581")}
        by_text = sorted(self._control.items(), key=lambda kv: -len(kv[1]))
        self._control_ids = {text: i for i, text in reversed(by_text)}
        self._split = re.compile("(" + "|".join(re.escape(t) for _, t in by_text) + ")") if by_text else None

    @classmethod
    def from_gguf_meta(cls, meta: dict[str, Any]) -> TextCodec:
        tok, detok = build_tokenizer_models(meta, add_bos=False)
        return cls(tok, detok, _id(meta, "bos_token_id"), bos_included=False, meta=meta)

    @classmethod
    def from_dir(cls, folder: Path, meta: Mapping[str, Any] | None = None) -> TextCodec:
        import openvino_tokenizers  # registers the tokenizer ops

        del openvino_tokenizers
        tok_xml, detok_xml = folder / TOKENIZER_XML, folder / DETOKENIZER_XML
        if not (tok_xml.is_file() and detok_xml.is_file()):
            raise CapabilityError(f"no {TOKENIZER_XML} / {DETOKENIZER_XML} in {str(folder)!r}")
        core = ov.Core()
        tok = core.read_model(str(tok_xml))
        bos = int(tok.get_rt_info("bos_token_id").astype(int)) if tok.has_rt_info("bos_token_id") else None
        return cls(tok, core.read_model(str(detok_xml)), bos, bos_included=True, meta=meta)

    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        ids = [self.bos_id] if add_bos and self.bos_id is not None else []
        if not special or self._split is None:
            return ids + self._plain(text)
        for part in self._split.split(text):
            if part in self._control_ids:
                ids.append(self._control_ids[part])
            elif part:
                ids += self._plain(part)
        return ids

    def _plain(self, text: str) -> list[int]:
        ids = [int(t) for t in self._tok.create_infer_request().infer([np.array([text])])["input_ids"][0]]
        if self._bos_included and ids and ids[0] == self.bos_id:
            ids = ids[1:]
        return ids

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        if not special or not any(int(t) in self._control for t in tokens):
            return self._detokenize(tokens)
        out: list[str] = []
        run: list[int] = []
        for t in [*map(int, tokens), None]:
            if t is not None and t not in self._control:
                run.append(t)
                continue
            if run:
                text = self._detokenize(run)
                lost = bool(out) and run[0] in self._spaced and not text.startswith(" ")
                out.append(" " + text if lost else text)
                run = []
            if t is not None:
                out.append(self._control[t])
        return "".join(out)

    def _detokenize(self, tokens: Sequence[int]) -> str:
        out = self._detok.create_infer_request().infer([np.asarray([list(tokens)], dtype=np.int64)])
        return str(out["string_output"][0])
