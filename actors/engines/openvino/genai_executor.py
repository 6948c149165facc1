"""Sessions whose KV the engine manages: openvino-genai's continuous batching with its own eviction.

Primitives:
- ``GenAIExecutor(model_path, num_threads=1, work_dir=None, kv_blocks=KV_BLOCKS)``: a
  ``kvres.actors.engines.executor.EngineManagedExecutor``, for when kvres does not own the KV:
  ``open_session`` / ``append`` (the token log), ``generate`` (one genai request over the whole
  log; greedy; it ends where the log fills the pool, and a log past it is a ``ContextLengthError``),
  ``session_cells()`` (the pool: ``kv_blocks * KV_BLOCK`` cells, the most a session's log can
  be), ``token_log``, ``resident_ranges`` (always empty: no KV is kept between calls),
  ``close_session``, ``tokenize`` / ``detokenize`` (``special`` as the OpenVINO executor's),
  ``n_vocab``, ``end_of_generation``, ``chat_template`` (the source GGUF's), ``truncate`` (the log
  only: no KV outlives a request; no logits), ``fork_session`` (the log and the eviction setting);
  ``set_eviction(session_id, stream_policy, budget_tokens, aggregation)`` gives a session genai's
  ``CacheEvictionConfig`` (SUM / NORM_SUM): "let the engine evict". The capabilities are all false;
  there are no range operations, and ``sampler`` raises ``CapabilityError``: genai samples inside
  its pipeline.

The model is exported once into ``work_dir / <first 16 hex digits of its model id>``; one
``GenAIEngine`` (pipeline, with a pool of ``kv_blocks``) is built per distinct eviction config and
reused.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kvres.actors.chat_source import ChatTemplateSource, eog_ids, read_chat_template, tokenizer_meta
from kvres.actors.engines.executor import EngineManagedExecutor
from kvres.actors.model_files import model_id
from kvres.actors.sampling import Sampler, SamplingParams
from kvres.policy import (
    Capabilities,
    CapabilityError,
    ContextLengthError,
    Range,
    SessionExistsError,
    StreamPolicy,
    UnknownSessionError,
)
from kvres.policy.tokens import token_ids

from ..session_table import check_truncate_length
from .genai import KV_BLOCK, KV_BLOCKS, EngineEviction, GenAIEngine, export_genai_model
from .text import TextCodec

ENGINE = "openvino-genai"


class GenAIExecutor(EngineManagedExecutor):
    engine = ENGINE

    def __init__(self, model_path: str | os.PathLike[str], num_threads: int = 1,
                 work_dir: str | os.PathLike[str] | None = None, kv_blocks: int = KV_BLOCKS) -> None:
        source = self.source = Path(model_path)
        self.model_id = model_id(source)
        root = Path(work_dir) if work_dir else Path(tempfile.gettempdir()) / "kvres-genai"
        self.model_dir = root / self.model_id.removeprefix("sha256:")[:16]
        if not (self.model_dir / "generation_config.json").is_file():
            export_genai_model(source, self.model_dir)
        self.fingerprint = f"{ENGINE}:{self.model_id}"
        self.num_threads = num_threads
        self.kv_blocks = kv_blocks
        self._engines: dict[EngineEviction | None, GenAIEngine] = {}
        self._logs: dict[str, list[int]] = {}
        self._eviction: dict[str, EngineEviction | None] = {}
        self._codec: TextCodec | None = None
        self._meta: dict[str, Any] | None = None
        self._n_vocab = int(json.loads((self.model_dir / "config.json").read_text())["vocab_size"])

    def capabilities(self) -> Capabilities:
        return Capabilities()

    def session_cells(self) -> int:
        return self.kv_blocks * KV_BLOCK

    def _log(self, session_id: str) -> list[int]:
        try:
            return self._logs[session_id]
        except KeyError:
            raise UnknownSessionError(session_id) from None

    def open_session(self, session_id: str, tokens: Sequence[int] = ()) -> None:
        if session_id in self._logs:
            raise SessionExistsError(session_id)
        self._logs[session_id] = [int(t) for t in tokens]
        self._eviction[session_id] = None

    def set_eviction(self, session_id: str, stream_policy: StreamPolicy | None, budget_tokens: int = 0,
                     aggregation: str = "NORM_SUM") -> None:
        """Sinks + recent window + the best-scoring blocks up to ``budget_tokens``, chosen by genai;
        ``stream_policy=None`` turns the engine's eviction off for the session."""
        self._log(session_id)
        self._eviction[session_id] = (
            None if stream_policy is None
            else EngineEviction.from_stream_policy(stream_policy, budget_tokens, aggregation)
        )

    def close_session(self, session_id: str) -> None:
        self._log(session_id)
        del self._logs[session_id], self._eviction[session_id]

    def token_log(self, session_id: str) -> list[int]:
        return list(self._log(session_id))

    def resident_ranges(self, session_id: str) -> list[Range]:
        self._log(session_id)
        return []

    def append(self, session_id: str, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        """Record tokens; genai prefills them with the next request (no logits come back)."""
        toks = [int(t) for t in tokens]
        if not toks:
            raise ValueError("append needs at least one token")
        self._log(session_id).extend(toks)
        return np.zeros(0, dtype=np.float32)

    def _engine(self, eviction: EngineEviction | None) -> GenAIEngine:
        if eviction not in self._engines:
            self._engines[eviction] = GenAIEngine(self.model_dir, eviction, num_threads=self.num_threads,
                                                  num_kv_blocks=self.kv_blocks)
        return self._engines[eviction]

    def generate(self, session_id: str, max_tokens: int, temperature: float = 0.0,
                 seed: int | None = None) -> list[int]:
        log = self._log(session_id)
        if max_tokens < 0:
            raise ValueError(f"max_tokens={max_tokens} must be >= 0")
        if temperature != 0:
            raise CapabilityError(f"the openvino-genai backend decodes greedily; temperature={temperature}")
        if not log:
            raise ValueError(f"session {session_id!r} has no tokens; append a prompt first")
        cells = self.session_cells()
        if len(log) > cells:  # genai would answer with no tokens and no error
            raise ContextLengthError(
                f"session {session_id!r} holds {len(log)} tokens, past the {cells} cells of the {ENGINE} KV pool "
                f"({self.kv_blocks} blocks of {KV_BLOCK}), which each request fills with the whole log")
        max_tokens = min(max_tokens, cells - len(log))  # the pool full: it ends there, as at max_tokens
        if max_tokens == 0:
            return []
        new = self._engine(self._eviction[session_id]).generate([log], max_tokens)[0]
        log.extend(int(t) for t in new)
        return [int(t) for t in new]

    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        return list(self._text().tokenize(text, add_bos, special))

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        return str(self._text().detokenize(token_ids(tokens, self._n_vocab), special))

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    def end_of_generation(self) -> frozenset[int]:
        return eog_ids(self._tokenizer_meta())

    def chat_template(self) -> ChatTemplateSource | None:
        return read_chat_template(self.source)

    def truncate(self, session_id: str, length: int) -> npt.NDArray[np.float32] | None:
        log = self._log(session_id)
        del log[check_truncate_length(session_id, length, len(log)):]
        return None

    def fork_session(self, source_id: str, new_id: str) -> None:
        log = self._log(source_id)
        if new_id in self._logs:
            raise SessionExistsError(new_id)
        self._logs[new_id] = list(log)
        self._eviction[new_id] = self._eviction[source_id]

    def sampler(self, params: SamplingParams) -> Sampler:
        raise CapabilityError(f"the {ENGINE} executor samples inside its own pipeline (greedy); it has no "
                              "sampler to hand out")

    def _tokenizer_meta(self) -> dict[str, Any]:
        if self._meta is None:
            self._meta = tokenizer_meta(self.source)
        return self._meta

    def _text(self) -> TextCodec:
        if self._codec is None:
            self._codec = TextCodec.from_dir(self.model_dir, self._tokenizer_meta())
        return self._codec

