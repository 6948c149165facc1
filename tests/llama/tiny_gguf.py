"""A random-weight Llama GGUF whose head_dim (32) admits quantized KV (q8_0 / q4_0 blocks of 32):
the project's own tiny demo model (kvres.actors.default_model).

stories260K has head_dim 8, which llama.cpp refuses to quantize; precision tests use this file.
"""

from __future__ import annotations

from pathlib import Path

from kvres.actors.default_model import write_tiny_model


def write_quantizable_model(path: Path, seed: int = 0) -> Path:
    return write_tiny_model(path, seed)
