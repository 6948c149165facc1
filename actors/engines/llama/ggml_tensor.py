"""Read ggml tensors from Python through libggml-base (ctypes), for eval callbacks.

Primitives:
- ``tensor_name(ptr) -> str``: the tensor's name (``ggml_get_name``).
- ``tensor_ne(ptr) -> tuple[int, int, int, int]``: its ggml dims, innermost first.
- ``read_f32(ptr) -> np.ndarray``: a copy of an F32 contiguous tensor's data, shaped in numpy
  order (ne[3], ne[2], ne[1], ne[0]), fetched with ``ggml_backend_tensor_get`` so it works
  whatever backend buffer holds it.

The dims come from the head of ``struct ggml_tensor`` (enum type, buffer pointer, int64 ne[4],
size_t nb[4]), which has kept this layout across ggml versions.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np
import numpy.typing as npt

GGML_TYPE_F32 = 0


class _TensorHead(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
    ]


@functools.cache
def _lib() -> ctypes.CDLL:
    import llama_cpp  # the wheel ships libggml-base next to libllama

    path = Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"
    lib = ctypes.CDLL(str(path))
    lib.ggml_get_name.argtypes = [ctypes.c_void_p]
    lib.ggml_get_name.restype = ctypes.c_char_p
    lib.ggml_nbytes.argtypes = [ctypes.c_void_p]
    lib.ggml_nbytes.restype = ctypes.c_size_t
    lib.ggml_backend_tensor_get.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
    ]
    lib.ggml_backend_tensor_get.restype = None
    return lib


def _head(ptr: int) -> _TensorHead:
    return _TensorHead.from_address(ptr)


def tensor_name(ptr: int) -> str:
    raw = _lib().ggml_get_name(ptr)
    return raw.decode("utf-8", "replace") if raw else ""


def tensor_ne(ptr: int) -> tuple[int, int, int, int]:
    ne = _head(ptr).ne
    return (int(ne[0]), int(ne[1]), int(ne[2]), int(ne[3]))


def read_f32(ptr: int) -> npt.NDArray[np.float32]:
    head = _head(ptr)
    if head.type != GGML_TYPE_F32:
        raise TypeError(f"tensor {tensor_name(ptr)!r} has ggml type {head.type}, expected F32 (0)")
    ne = tensor_ne(ptr)
    expected_nb = [4, 4 * ne[0], 4 * ne[0] * ne[1], 4 * ne[0] * ne[1] * ne[2]]
    if [int(x) for x in head.nb] != expected_nb:
        raise ValueError(f"tensor {tensor_name(ptr)!r} is not contiguous (nb={list(head.nb)})")
    out = np.empty((ne[3], ne[2], ne[1], ne[0]), dtype=np.float32)
    _lib().ggml_backend_tensor_get(ptr, out.ctypes.data, 0, out.nbytes)
    return out
