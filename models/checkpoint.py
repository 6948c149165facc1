"""The torch-free checkpoint of the passkey model: float32 arrays in a .npz plus a JSON config.

Primitives:
- ``ModelConfig``: the Llama geometry (vocab, width, layers, heads, FFN, RoPE base, RMS eps, context).
- ``tensor_names(cfg)``: the checkpoint's array names, which are the GGUF tensor names
  (``token_embd.weight``, ``blk.{i}.attn_q.weight``, ...); matrices are stored (out, in) like torch.
- ``save_checkpoint(dir, stem, arrays, config)``: writes ``<stem>.npz`` with fixed zip timestamps
  (same arrays -> same bytes) and ``<stem>.json``.
- ``load_checkpoint(dir, stem) -> (arrays, config)``: reads them back and checks every shape.
- ``sha256_file(path)``.

RoPE is llama.cpp's NORM layout (adjacent pairs x[2i], x[2i+1]), so the weights go into a GGUF as
they are, with no q/k permutation.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int = 128
    n_layers: int = 3
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 32
    d_ff: int = 384
    rope_base: float = 10000.0
    rms_eps: float = 1e-5
    context_length: int = 512

    def __post_init__(self) -> None:
        if self.n_heads * self.head_dim != self.d_model:
            raise ValueError(
                f"n_heads*head_dim ({self.n_heads}*{self.head_dim}) must equal d_model ({self.d_model})"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        return cls(**d)


def tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape, in the checkpoint's (torch, (out, in)) layout, in GGUF writing order."""
    d, kv = cfg.d_model, cfg.n_kv_heads * cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (cfg.vocab_size, d)}
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        shapes[p + "attn_norm.weight"] = (d,)
        shapes[p + "attn_q.weight"] = (d, d)
        shapes[p + "attn_k.weight"] = (kv, d)
        shapes[p + "attn_v.weight"] = (kv, d)
        shapes[p + "attn_output.weight"] = (d, d)
        shapes[p + "ffn_norm.weight"] = (d,)
        shapes[p + "ffn_gate.weight"] = (cfg.d_ff, d)
        shapes[p + "ffn_up.weight"] = (cfg.d_ff, d)
        shapes[p + "ffn_down.weight"] = (d, cfg.d_ff)
    shapes["output_norm.weight"] = (d,)
    shapes["output.weight"] = (cfg.vocab_size, d)
    return shapes


def tensor_names(cfg: ModelConfig) -> list[str]:
    return list(tensor_shapes(cfg))


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_checkpoint(
    directory: str | Path, stem: str, arrays: dict[str, np.ndarray], config: dict[str, Any]
) -> tuple[Path, Path]:
    """Write ``<stem>.npz`` (stored, fixed timestamps, sorted by GGUF order) and ``<stem>.json``.

    ``config`` must hold ``"model"`` (a ``ModelConfig`` dict); anything else (vocab, training
    settings) is kept as given.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cfg = ModelConfig.from_dict(config["model"])
    _check_arrays(arrays, cfg)
    npz = directory / f"{stem}.npz"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name in tensor_names(cfg):
            arr = np.ascontiguousarray(arrays[name], dtype=np.float32)
            member = io.BytesIO()
            np.lib.format.write_array(member, arr, allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=_ZIP_EPOCH)
            info.external_attr = 0o644 << 16
            zf.writestr(info, member.getvalue())
    npz.write_bytes(buf.getvalue())
    js = directory / f"{stem}.json"
    js.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return npz, js


def load_checkpoint(directory: str | Path, stem: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    directory = Path(directory)
    js, npz = directory / f"{stem}.json", directory / f"{stem}.npz"
    for p in (js, npz):
        if not p.is_file():
            raise FileNotFoundError(f"checkpoint file missing: {p}")
    config = json.loads(js.read_text())
    if "model" not in config:
        raise ValueError(f"{js}: no 'model' section")
    cfg = ModelConfig.from_dict(config["model"])
    with np.load(npz, allow_pickle=False) as z:
        arrays = {k: np.asarray(z[k], dtype=np.float32) for k in z.files}
    _check_arrays(arrays, cfg)
    return arrays, config


def _check_arrays(arrays: dict[str, np.ndarray], cfg: ModelConfig) -> None:
    shapes = tensor_shapes(cfg)
    missing = sorted(set(shapes) - set(arrays))
    extra = sorted(set(arrays) - set(shapes))
    if missing or extra:
        raise ValueError(f"checkpoint tensors do not match the config: missing {missing}, unexpected {extra}")
    for name, shape in shapes.items():
        if tuple(arrays[name].shape) != shape:
            raise ValueError(f"tensor {name}: shape {tuple(arrays[name].shape)}, config expects {shape}")
