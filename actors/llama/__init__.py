"""kvres.actors.llama: the llama.cpp backend (llama-cpp-python's low-level API).

Primitives:
- ``LlamaExecutor``: the executor protocol on one llama.cpp context shared by many sessions.
- ``AttentionCapture``: captured attention probabilities with token-log labels.
- ``ContextFullError``, ``SessionLimitError``, ``EngineError``: this backend's typed errors.
- ``LlamaBackend`` (a plain class forwarding to an executor) and ``remote_backend(**ray_options)``
  (the Ray actor class, built on demand), from ``actor.py``.

Importing this package loads neither llama.cpp nor Ray; both load on first use.
"""

from .actor import LlamaBackend, remote_backend
from .attention import AttentionCapture
from .errors import ContextFullError, EngineError, SessionLimitError
from .executor import LlamaExecutor

__all__ = [
    "AttentionCapture",
    "ContextFullError",
    "EngineError",
    "LlamaBackend",
    "LlamaExecutor",
    "SessionLimitError",
    "remote_backend",
]
