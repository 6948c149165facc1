"""Compiled models shared between OpenVINO executors of one process, a bounded number of them.

Primitives:
- ``compile_config(precision, num_threads) -> dict``: the plugin properties every compilation
  here uses (one stream; ``precision="f32"`` forces f32 inference and f32 KV).
- ``CompiledModelCache(max_entries=4)``: ``get(model_path, device, precision, num_threads) ->
  (LoadedModel, ov.CompiledModel)`` loads and compiles on a miss and keeps the ``max_entries``
  most recently used (a file's modification time is part of the key, so a rewritten file is
  compiled anew); ``len(cache)``.
- ``SHARED_CACHE``: the instance executors use unless they are given one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import openvino as ov

from .model import LoadedModel, load_model

_Key = tuple[str, int, str, str, int]


def compile_config(precision: str, num_threads: int) -> dict[str, Any]:
    config: dict[str, Any] = {"INFERENCE_NUM_THREADS": num_threads, "NUM_STREAMS": 1}
    if precision == "f32":
        config |= {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
    return config


class CompiledModelCache:
    def __init__(self, max_entries: int = 4) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._entries: OrderedDict[_Key, tuple[LoadedModel, ov.CompiledModel]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(
        self, model_path: Path, device: str, precision: str, num_threads: int
    ) -> tuple[LoadedModel, ov.CompiledModel]:
        mtime = model_path.stat().st_mtime_ns if model_path.is_file() else 0
        key = (str(model_path.resolve()), mtime, device, precision, num_threads)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
            loaded = load_model(model_path)
            compiled = ov.Core().compile_model(loaded.model, device, compile_config(precision, num_threads))
            self._entries[key] = (loaded, compiled)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            return loaded, compiled


SHARED_CACHE = CompiledModelCache()
