"""Convert a Llama GGUF file into a stateful OpenVINO IR on disk.

Primitives:
- ``convert_gguf_to_ir(gguf_path, out_dir, attention="explicit") -> Path``: writes
  ``openvino_model.xml`` / ``.bin`` (f32 weights, no fp16 compression) into ``out_dir`` and returns
  the xml path. ``attention="sdpa"`` writes the ScaledDotProductAttention form (for openvino-genai).
"""

from __future__ import annotations

import os
from pathlib import Path

import openvino as ov

from .gguf_weights import read_llama_gguf
from .graph import build_llama_model
from .model import IR_FILE


def convert_gguf_to_ir(
    gguf_path: str | os.PathLike[str], out_dir: str | os.PathLike[str], attention: str = "explicit"
) -> Path:
    weights = read_llama_gguf(gguf_path)
    model = build_llama_model(weights, attention=attention)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    xml = out / IR_FILE
    ov.save_model(model, str(xml), compress_to_fp16=False)
    return xml
