"""Text <-> token ids for the OpenVINO executor, with OpenVINO tokenizer models (no llama.cpp).

Primitives:
- ``TextCodec.from_gguf_meta(meta)``: tokenizer / detokenizer built from a GGUF's SentencePiece
  vocabulary (``genai_tokenizer.build_tokenizer_models``); ``TextCodec.from_dir(folder)``: the
  ``openvino_tokenizer.xml`` / ``openvino_detokenizer.xml`` of a genai model folder.
- ``tokenize(text, add_bos=True) -> list[int]``, ``detokenize(tokens) -> str``.
Raises ``CapabilityError`` naming the folder when it holds no tokenizer models.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov

from kvres.policy.errors import CapabilityError

from .genai_tokenizer import build_tokenizer_models

TOKENIZER_XML = "openvino_tokenizer.xml"
DETOKENIZER_XML = "openvino_detokenizer.xml"


class TextCodec:
    def __init__(self, tokenizer: ov.Model, detokenizer: ov.Model, bos_id: int | None, bos_included: bool) -> None:
        core = ov.Core()
        self._tok = core.compile_model(tokenizer, "CPU")
        self._detok = core.compile_model(detokenizer, "CPU")
        self.bos_id = bos_id
        self._bos_included = bos_included

    @classmethod
    def from_gguf_meta(cls, meta: dict[str, Any]) -> TextCodec:
        tok, detok = build_tokenizer_models(meta, add_bos=False)
        bos = meta.get("bos_token_id")
        return cls(tok, detok, int(bos) if bos is not None else None, bos_included=False)

    @classmethod
    def from_dir(cls, folder: Path) -> TextCodec:
        import openvino_tokenizers  # registers the tokenizer ops

        del openvino_tokenizers
        tok_xml, detok_xml = folder / TOKENIZER_XML, folder / DETOKENIZER_XML
        if not (tok_xml.is_file() and detok_xml.is_file()):
            raise CapabilityError(f"no {TOKENIZER_XML} / {DETOKENIZER_XML} in {str(folder)!r}")
        core = ov.Core()
        tok = core.read_model(str(tok_xml))
        bos = int(tok.get_rt_info("bos_token_id").astype(int)) if tok.has_rt_info("bos_token_id") else None
        return cls(tok, core.read_model(str(detok_xml)), bos, bos_included=True)

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        ids = [int(t) for t in self._tok.create_infer_request().infer([np.array([text])])["input_ids"][0]]
        if self._bos_included and ids and ids[0] == self.bos_id:
            ids = ids[1:]
        if add_bos and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return ids

    def detokenize(self, tokens: Sequence[int]) -> str:
        out = self._detok.create_infer_request().infer([np.asarray([list(tokens)], dtype=np.int64)])
        return str(out["string_output"][0])
