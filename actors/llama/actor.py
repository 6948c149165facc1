"""The Ray face of the llama.cpp backend: a thin shell around one ``LlamaExecutor``.

Primitives:
- ``LlamaBackend(model_path, **executor_options)``: a plain class holding a ``LlamaExecutor``;
  each method forwards to it (the executor protocol, ``generate``, ``stream``, ``attention``,
  ``flush``, ``kv_profile``, ``tokenize``, ``detokenize``) plus ``describe()`` for what a remote caller
  cannot read as attributes (fingerprint, model id, n_ctx, KV types, free cells, sessions).
- ``remote_backend(**ray_options)``: ``ray.remote(**ray_options)(LlamaBackend)``, built on call so
  importing this module needs no Ray.

Generation runs inside the actor: one remote call for ``generate``; ``stream`` is a generator
method, which Ray turns into a streaming generator (``ObjectRefGenerator``) so tokens flow back
as they are produced without one remote call per token.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kvres.coldstore.block import KVBlock
from kvres.policy.capabilities import Capabilities
from kvres.policy.capacity import LayerKVProfile
from kvres.policy.ranges import Range

from .attention import AttentionCapture
from .executor import LlamaExecutor


class LlamaBackend:
    def __init__(self, model_path: str | os.PathLike[str], **executor_options: Any) -> None:
        self._executor = LlamaExecutor(model_path, **executor_options)

    @property
    def executor(self) -> LlamaExecutor:
        return self._executor

    def describe(self) -> dict[str, Any]:
        e = self._executor
        return {
            "engine": e.engine, "model_id": e.model_id, "model_path": str(e.model_path),
            "fingerprint": e.fingerprint, "n_ctx": e.n_ctx, "n_seq_max": e.n_seq_max,
            "type_k": e.type_k, "type_v": e.type_v, "flash_attn": e.flash_attn,
            "free_cells": e.free_cells(), "sessions": e.sessions(),
        }

    # -- the executor protocol ------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        return self._executor.capabilities()

    def open_session(self, session_id: str, tokens: Sequence[int] = ()) -> None:
        self._executor.open_session(session_id, tokens)

    def close_session(self, session_id: str) -> None:
        self._executor.close_session(session_id)

    def append(self, session_id: str, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        return self._executor.append(session_id, tokens)

    def token_log(self, session_id: str) -> list[int]:
        return self._executor.token_log(session_id)

    def resident_ranges(self, session_id: str) -> list[Range]:
        return self._executor.resident_ranges(session_id)

    def evict_range(self, session_id: str, rng: Range, rebase: bool = False) -> None:
        self._executor.evict_range(session_id, rng, rebase)

    def admit_range(self, session_id: str, rng: Range) -> None:
        self._executor.admit_range(session_id, rng)

    def export_range(self, session_id: str, rng: Range) -> KVBlock:
        return self._executor.export_range(session_id, rng)

    def import_range(self, session_id: str, block: KVBlock) -> None:
        self._executor.import_range(session_id, block)

    def block_attention_scores(self, session_id: str, ranges: Sequence[Range]) -> list[float]:
        return self._executor.block_attention_scores(session_id, ranges)

    # -- beyond the protocol --------------------------------------------------------------
    def generate(
        self, session_id: str, max_tokens: int, temperature: float = 0.0, seed: int | None = None,
        stop_at_eog: bool = True,
    ) -> list[int]:
        return self._executor.generate(session_id, max_tokens, temperature, seed, stop_at_eog)

    def stream(
        self, session_id: str, max_tokens: int, temperature: float = 0.0, seed: int | None = None,
        stop_at_eog: bool = True,
    ) -> Iterator[int]:
        yield from self._executor.stream(session_id, max_tokens, temperature, seed, stop_at_eog)

    def flush(self, session_id: str | None = None) -> None:
        self._executor.flush(session_id)

    def attention(self, session_id: str, window: int | None = None) -> AttentionCapture:
        return self._executor.attention(session_id, window)

    def kv_profile(self) -> LayerKVProfile:
        return self._executor.kv_profile()

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return self._executor.tokenize(text, add_bos)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._executor.detokenize(tokens)


def remote_backend(**ray_options: Any) -> Any:
    """The Ray actor class for ``LlamaBackend`` (e.g. ``remote_backend(num_cpus=1).remote(path)``)."""
    import ray

    return ray.remote(**ray_options)(LlamaBackend) if ray_options else ray.remote(LlamaBackend)
