"""A model's vocabulary in the replica, so streamed text is decoded here, not by a call per token.

Primitives:
- ``LocalVocab(path)``: llama.cpp's vocabulary alone (``vocab_only``: no weights) of a GGUF file,
  loaded in this process; ``detokenize(tokens, special=False) -> str`` is the same llama.cpp call,
  with the same flags, that a llama.cpp backend's ``detokenize`` makes, so the text is the same.
- ``local_vocab(path) -> LocalVocab | None``: one per file and process; None where llama.cpp is not
  installed here or the file cannot be loaded on this node (the caller then asks the backend).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("kvres.serve")


class LocalVocab:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        import llama_cpp as ll

        self._ll = ll
        ll.llama_backend_init()
        params = ll.llama_model_default_params()
        params.vocab_only = True
        self._model = ll.llama_model_load_from_file(os.fsencode(Path(path)), params)
        if not self._model:
            raise ValueError(f"llama.cpp could not load the vocabulary of {os.fspath(path)!r}")
        self._vocab = ll.llama_model_get_vocab(self._model)
        self.n_vocab = int(ll.llama_vocab_n_tokens(self._vocab))
        self._lock = threading.Lock()

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        ids = [int(t) for t in tokens]
        bad = next((t for t in ids if not 0 <= t < self.n_vocab), None)
        if bad is not None:  # llama.cpp aborts the process on an unknown id
            raise ValueError(f"token {bad} is outside the vocabulary [0, {self.n_vocab})")
        ll: Any = self._ll
        array = (ll.llama_token * max(1, len(ids)))(*ids)
        cap = 8 * len(ids) + 16
        with self._lock:
            for _ in range(2):
                out = ctypes.create_string_buffer(cap)
                n = ll.llama_detokenize(self._vocab, array, len(ids), out, cap, False, special)
                if n >= 0:
                    return str(out.raw[:n].decode("utf-8", "replace"))
                cap = -n
        raise ValueError(f"llama_detokenize failed on {len(ids)} tokens")


@functools.lru_cache(maxsize=8)
def local_vocab(path: str) -> LocalVocab | None:
    try:
        return LocalVocab(path)
    except Exception as exc:  # no llama.cpp here, or no such file on this node: decode on the backend
        log.info("kvres serve: decoding on the backend for %s (%s: %s)", path, type(exc).__name__, exc)
        return None
