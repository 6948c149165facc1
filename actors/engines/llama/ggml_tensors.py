"""ggml's own C functions, from the libraries the llama-cpp-python wheel ships next to libllama.

Primitives:
- ``tensor_name(ptr)`` and ``read_f32(ptr)``: a tensor's name, and a copy of an F32 contiguous
  tensor (numpy order ``(ne[3], ne[2], ne[1], ne[0])``, fetched with ``ggml_backend_tensor_get``
  whatever backend buffer holds it), for eval callbacks (``library.eval_callback``).
- ``f16_to_f32(values)`` / ``f32_to_f16(values)``: ggml's vectorised converters, bit-identical to
  numpy's ``astype`` (round to nearest even) and ~20x faster (numpy where the library lacks them).

A tensor's dims come from the head of ``struct ggml_tensor`` (enum type, buffer pointer, int64
ne[4], size_t nb[4]), which has kept this layout across ggml versions.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt


@functools.cache
def _ggml_lib(name: str) -> ctypes.CDLL:
    import llama_cpp  # the wheel ships the ggml libraries next to libllama

    return ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / name))


class _TensorHead(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
    ]


_GGML_TYPE_F32 = 0


@functools.cache
def _tensor_lib() -> ctypes.CDLL:
    lib = _ggml_lib("libggml-base.so")
    lib.ggml_get_name.argtypes = [ctypes.c_void_p]
    lib.ggml_get_name.restype = ctypes.c_char_p
    lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    lib.ggml_backend_tensor_get.restype = None
    return lib


def tensor_name(ptr: int) -> str:
    raw = _tensor_lib().ggml_get_name(ptr)
    return raw.decode("utf-8", "replace") if raw else ""


def read_f32(ptr: int) -> npt.NDArray[np.float32]:
    head = _TensorHead.from_address(ptr)
    if head.type != _GGML_TYPE_F32:
        raise TypeError(f"tensor {tensor_name(ptr)!r} has ggml type {head.type}, expected F32 (0)")
    ne = [int(x) for x in head.ne]
    expected_nb = [4, 4 * ne[0], 4 * ne[0] * ne[1], 4 * ne[0] * ne[1] * ne[2]]
    if [int(x) for x in head.nb] != expected_nb:
        raise ValueError(f"tensor {tensor_name(ptr)!r} is not contiguous (nb={list(head.nb)})")
    out = np.empty((ne[3], ne[2], ne[1], ne[0]), dtype=np.float32)
    _tensor_lib().ggml_backend_tensor_get(ptr, out.ctypes.data, 0, out.nbytes)
    return out


@functools.cache
def _half_converters() -> tuple[Any, Any] | None:
    """ggml's f16 -> f32 and f32 -> f16 converters, or None where the library lacks them."""
    try:
        lib = _ggml_lib("libggml-cpu.so")
        converters = (lib.ggml_cpu_fp16_to_fp32, lib.ggml_cpu_fp32_to_fp16)
    except (OSError, AttributeError):
        return None
    for fn in converters:
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        fn.restype = None
    return converters


def _convert_halfs(values: npt.ArrayLike, src: type[np.floating[Any]], dst: type[np.floating[Any]]) -> Any:
    arr = np.ascontiguousarray(values, dtype=src)
    converters = _half_converters()
    if converters is None:
        return arr.astype(dst)
    out = np.empty(arr.shape, dtype=dst)
    converters[0 if src is np.float16 else 1](arr.ctypes.data, out.ctypes.data, arr.size)
    return out


def f16_to_f32(values: npt.ArrayLike) -> npt.NDArray[np.float32]:
    converted: npt.NDArray[np.float32] = _convert_halfs(values, np.float16, np.float32)
    return converted


def f32_to_f16(values: npt.ArrayLike) -> npt.NDArray[np.float16]:
    converted: npt.NDArray[np.float16] = _convert_halfs(values, np.float32, np.float16)
    return converted
