"""f16 <-> f32 conversion of KV rows through ggml's CPU kernels (numpy's own is ~20x slower).

Primitives:
- ``f16_to_f32(values) -> float32 array``, ``f32_to_f16(values) -> float16 array``: the same
  shape, bit-identical to numpy's ``astype`` (round to nearest even); ggml's vectorised converters
  from the libggml-cpu that llama-cpp-python ships, numpy where that library lacks them.

Why: moving a session's cells rotates their f16 keys in f32; at ~1,000 cells numpy's software
conversion alone costs milliseconds, ggml's a tenth of one.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np
import numpy.typing as npt

_Converters = tuple[Any, Any]
_looked_up = False
_converters: _Converters | None = None


def _lookup() -> _Converters | None:
    global _looked_up, _converters
    if not _looked_up:
        _looked_up = True
        try:
            import llama_cpp

            lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-cpu.so"))
            to32, to16 = lib.ggml_cpu_fp16_to_fp32, lib.ggml_cpu_fp32_to_fp16
            for fn in (to32, to16):
                fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
                fn.restype = None
            _converters = (to32, to16)
        except (OSError, AttributeError):
            _converters = None
    return _converters


def f16_to_f32(values: npt.NDArray[np.float16]) -> npt.NDArray[np.float32]:
    src = np.ascontiguousarray(values, dtype=np.float16)
    fns = _lookup()
    if fns is None:
        return src.astype(np.float32)
    out = np.empty(src.shape, dtype=np.float32)
    fns[0](src.ctypes.data, out.ctypes.data, src.size)
    return out


def f32_to_f16(values: npt.NDArray[np.float32]) -> npt.NDArray[np.float16]:
    src = np.ascontiguousarray(values, dtype=np.float32)
    fns = _lookup()
    if fns is None:
        return src.astype(np.float16)
    out = np.empty(src.shape, dtype=np.float16)
    fns[1](src.ctypes.data, out.ctypes.data, src.size)
    return out
