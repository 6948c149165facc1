"""OpenVINO tokenizer / detokenizer models from a llama GGUF's SentencePiece vocabulary.

Primitives:
- ``sentencepiece_model_bytes(tokenizer_meta) -> bytes``: a serialized SentencePiece ``ModelProto``
  (BPE, byte fallback, dummy prefix unless ``add_space_prefix`` is false, as llama.cpp's SPM
  tokenizer) built from the GGUF's ``tokenizer.ggml.tokens / scores / token_type``; written with a tiny protobuf encoder (no
  sentencepiece or transformers package needed).
- ``build_tokenizer_models(tokenizer_meta) -> (tokenizer, detokenizer)``: ``ov.Model`` pair with the
  openvino_tokenizers ``SentencepieceTokenizer`` / ``SentencepieceDetokenizer`` ops: string in,
  ``input_ids`` / ``attention_mask`` (i64) out; i64 ids in, ``string_output`` out; bos/eos/pad ids
  in rt_info, where openvino-genai's ``Tokenizer`` reads them.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import openvino as ov
import openvino.opset13 as ops

from kvres.policy.errors import ModelLoadError

_BPE = 2
_GGUF_TO_SP_TYPE = {1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6}  # normal, unknown, control, user, unused, byte


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field_bytes(field: int, data: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _field_int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _field_float(field: int, value: float) -> bytes:
    return _varint(field << 3 | 5) + struct.pack("<f", value)


def sentencepiece_model_bytes(meta: dict[str, Any]) -> bytes:
    if meta.get("model") != "llama":
        raise ModelLoadError(
            f"tokenizer model {meta.get('model')!r} is not a SentencePiece ('llama') vocabulary"
        )
    tokens, scores, types = meta["tokens"], meta.get("scores"), meta.get("token_type")
    n = len(tokens)
    scores = scores if scores is not None else [0.0] * n
    types = types if types is not None else [1] * n
    pieces = b"".join(
        _field_bytes(1, _field_bytes(1, str(tok).encode("utf-8")) + _field_float(2, float(sc))
                     + _field_int(3, _GGUF_TO_SP_TYPE.get(int(ty), 1)))
        for tok, sc, ty in zip(tokens, scores, types, strict=True)
    )
    has_bytes = any(int(t) == 6 for t in types)
    trainer = (
        _field_int(3, _BPE) + _field_int(4, n) + _field_int(35, int(has_bytes))
        + _field_int(40, int(meta.get("unknown_token_id", 0)))
        + _field_int(41, int(meta.get("bos_token_id", 1)))
        + _field_int(42, int(meta.get("eos_token_id", 2)))
        + _field_int(43, -1)
    )
    dummy_prefix = int(bool(meta.get("add_space_prefix", True)))  # llama.cpp's default for SPM
    normalizer = (
        _field_bytes(1, b"identity") + _field_int(3, dummy_prefix) + _field_int(4, 0) + _field_int(5, 1)
    )
    return pieces + _field_bytes(2, trainer) + _field_bytes(3, normalizer)


def build_tokenizer_models(meta: dict[str, Any], add_bos: bool = True) -> tuple[ov.Model, ov.Model]:
    import openvino_tokenizers  # registers the tokenizer ops with OpenVINO
    from openvino_tokenizers import _get_factory

    del openvino_tokenizers
    sp = ops.constant(np.frombuffer(sentencepiece_model_bytes(meta), dtype=np.uint8))
    text = ops.parameter(ov.PartialShape(["?"]), ov.Type.string, name="string_input")
    indices, values, dense_shape = _get_factory().create(
        "SentencepieceTokenizer", [sp.output(0), text.output(0)],
        {"add_bos": add_bos, "add_eos": False, "reverse": False, "alpha": 1.0, "nbest_size": 1},
    ).outputs()
    zeros = ops.broadcast(ops.constant(np.int32(0)), dense_shape)
    ids = ops.convert(ops.scatter_nd_update(zeros, indices, values), ov.Type.i64)
    ones = ops.broadcast(ops.constant(np.int32(1)), ops.shape_of(values))
    mask = ops.convert(ops.scatter_nd_update(zeros, indices, ones), ov.Type.i64)
    ids.output(0).get_tensor().set_names({"input_ids"})
    mask.output(0).get_tensor().set_names({"attention_mask"})
    tokenizer = ov.Model([ids.output(0), mask.output(0)], [text], "tokenizer")

    token_ids = ops.parameter(ov.PartialShape(["?", "?"]), ov.Type.i64, name="token_ids")
    parts = _get_factory().create(
        "SentencepieceDetokenizer", [sp.output(0), ops.convert(token_ids, ov.Type.i32).output(0)]
    ).outputs()
    packed = _get_factory("opset15").create("StringTensorPack", parts).outputs()
    packed[0].get_tensor().set_names({"string_output"})
    detokenizer = ov.Model(packed, [token_ids], "detokenizer")

    for model in (tokenizer, detokenizer):
        for key in ("bos_token_id", "eos_token_id"):
            if meta.get(key) is not None:
                model.set_rt_info(int(meta[key]), key)
        pad = meta.get("padding_token_id")
        model.set_rt_info(int(pad) if pad is not None and int(pad) < 2**31 else 0, "pad_token_id")
    return tokenizer, detokenizer
