"""Quantized KV rows read back as f16: what a scoring pass over a quantized cache attends with.

Primitives:
- ``dequantize_rows(rows, type_name) -> float16 array``: rows of raw ``q8_0`` or ``q4_0`` blocks
  (bytes on the last axis, whole blocks) as their values, rounded to f16; ``DEQUANTIZABLE``: the
  KV type names it reads. The blocks are decoded by the ``gguf`` package's reference dequantizer
  (ggml's block layouts, the product taken in f32 as ggml's own).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from kvres.policy.errors import CapabilityError

DEQUANTIZABLE = {"q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0}


def dequantize_rows(rows: npt.NDArray[np.uint8], type_name: str) -> npt.NDArray[np.float16]:
    qtype = DEQUANTIZABLE.get(type_name)
    if qtype is None:
        raise CapabilityError(f"{type_name!r} KV rows cannot be read back as f16 (readable: {', '.join(DEQUANTIZABLE)})")
    try:
        values = dequantize(np.ascontiguousarray(rows), qtype)
    except (ValueError, AssertionError) as exc:
        raise CapabilityError(f"{type_name} rows of {rows.shape[-1]} bytes are not whole blocks: {exc}") from None
    return values.astype(np.float16)
