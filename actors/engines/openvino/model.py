"""Load a stateful LLM for the OpenVINO executor: a Llama GGUF (converted in memory) or an IR.

Primitives:
- ``LoadedModel``: the ``ov.Model`` plus what the executor needs from it: ``model_id`` (the
  source GGUF's ``kvres.actors.model_files.model_id``, recorded in a converted IR, else the IR
  weights file's), ``geometry`` (``KVGeometry``), ``state_names`` ((key, value) variable ids per
  layer), ``rope`` (``RopeParams`` or None when the IR does not say how its keys were rotated),
  ``vocab_size``, ``has_attention_probs`` (explicit Softmax attention the scoring pass can expose).
- ``load_model(path) -> LoadedModel``: ``.gguf`` -> ``build_llama_model``; ``.xml`` or a folder with
  ``openvino_model.xml`` -> ``ov.Core().read_model``. Raises ``ModelLoadError`` naming the path for
  a missing file, a file that is neither a GGUF nor an IR, or an IR without KV states / inputs.
- ``inspect_model(model, model_id, source) -> LoadedModel``: the same checks on an in-memory model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import openvino as ov

from kvres.actors.model_files import GGUF_MAGIC, model_id
from kvres.coldstore.block import KVGeometry
from kvres.policy.errors import ModelLoadError

from .gguf_weights import read_llama_gguf
from .graph import ATTN_PROBS_TAG, KV_STATE_PATTERN, RT_INFO_ROOT, build_llama_model
from .rope import RopeParams

REQUIRED_INPUTS = ("input_ids", "attention_mask", "position_ids", "beam_idx")
IR_FILE = "openvino_model.xml"


@dataclass(frozen=True)
class LoadedModel:
    model: ov.Model
    model_id: str
    geometry: KVGeometry
    state_names: tuple[tuple[str, str], ...]
    rope: RopeParams | None
    vocab_size: int
    has_attention_probs: bool
    source: str
    tokenizer_meta: dict[str, Any] | None = None  # a GGUF's tokenizer.ggml.* fields, when known


def _rt(model: ov.Model, key: str) -> str | None:
    if not model.has_rt_info([RT_INFO_ROOT, key]):
        return None
    return str(model.get_rt_info([RT_INFO_ROOT, key]).astype(str))


def inspect_model(model: ov.Model, model_id: str, source: str) -> LoadedModel:
    names = {n for p in model.inputs for n in p.get_names()}
    missing = [n for n in REQUIRED_INPUTS if n not in names]
    if missing:
        raise ModelLoadError(f"model {source!r} lacks input {missing[0]!r} (has {sorted(names)})")
    layers: dict[int, dict[str, tuple[str, ov.PartialShape]]] = {}
    for op in model.get_ordered_ops():
        if op.get_type_name() != "ReadValue":
            continue
        vid = op.get_variable_id()
        m = KV_STATE_PATTERN.match(vid)
        if m:
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = (vid, op.get_output_partial_shape(0))
    if not layers:
        raise ModelLoadError(
            f"model {source!r} has no KV states (no ReadValue variable named past_key_values.<i>.key/value): "
            "it is not a stateful LLM IR"
        )
    if sorted(layers) != list(range(len(layers))) or any(len(v) != 2 for v in layers.values()):
        raise ModelLoadError(f"model {source!r} has an incomplete set of KV states: layers {sorted(layers)}")
    shape = layers[0]["key"][1]
    if shape.rank.is_dynamic or shape.rank.get_length() != 4 or shape[1].is_dynamic or shape[3].is_dynamic:
        raise ModelLoadError(f"model {source!r}: KV state shape {shape} is not [batch, kv_heads, seq, head_dim]")
    geometry = KVGeometry(len(layers), shape[1].get_length(), shape[3].get_length())
    base = _rt(model, "rope_freq_base")
    rope = RopeParams(float(base), geometry.head_dim) if base and _rt(model, "rope_style") == "norm" else None
    vocab = model.output(0).get_partial_shape()[2]
    has_probs = any(op.get_friendly_name().startswith(ATTN_PROBS_TAG) for op in model.get_ordered_ops()
                    if op.get_type_name() == "Softmax")
    return LoadedModel(
        model=model,
        model_id=_rt(model, "model_id") or model_id,
        geometry=geometry,
        state_names=tuple((layers[i]["key"][0], layers[i]["value"][0]) for i in range(len(layers))),
        rope=rope,
        vocab_size=vocab.get_length() if vocab.is_static else int(_rt(model, "vocab_size") or 0),
        has_attention_probs=has_probs,
        source=source,
    )


def load_model(path: str | os.PathLike[str]) -> LoadedModel:
    p = Path(path)
    if p.is_dir():
        p = p / IR_FILE
    if not p.is_file():
        raise ModelLoadError(f"model file {str(p)!r} does not exist")
    with p.open("rb") as f:
        head = f.read(64)
    if head[:4] == GGUF_MAGIC:
        weights = read_llama_gguf(p)
        loaded = inspect_model(build_llama_model(weights), weights.model_id, str(p))
        return replace(loaded, tokenizer_meta=weights.tokenizer)
    looks_like_xml = b"<net" in head or b"<?xml" in head
    if p.suffix != ".xml" or not looks_like_xml:
        raise ModelLoadError(
            f"{str(p)!r} is neither a GGUF file nor an OpenVINO IR (.xml); first bytes {head[:16]!r}"
        )
    try:
        model = ov.Core().read_model(str(p))
    except RuntimeError as exc:
        raise ModelLoadError(f"OpenVINO cannot read IR {str(p)!r}: {exc}") from exc
    bin_path = p.with_suffix(".bin")
    return inspect_model(model, model_id(bin_path if bin_path.is_file() else p), str(p))
