"""kvres.actors.engines.llama: the llama.cpp backend, and the one binding of llama-cpp-python in kvres.

Primitives:
- ``LlamaExecutor``: the executor contract (``kvres.actors.engines.executor.Executor``) on one llama.cpp
  context shared by many sessions.
- ``ContextFullError``, ``SessionLimitError``, ``EngineError``: this backend's typed errors.
- ``engine``: ``LlamaModel`` and ``LlamaContext``, the low-level API every llama.cpp user in the
  tree (probes, benchmarks, model evaluation) builds on, and the only module here that calls
  llama.cpp or ggml (ctypes).

The executor's parts: ``cache_ops`` (cell-level operations on the context), ``session``,
``blocks`` (the KV block format and its checks), ``state_blob`` (state blobs as arrays),
``recall`` (cold blocks scored and exchanged in numpy, with ``rope`` and ``quant_rows``),
``attention`` (the scoring context), ``edits`` (truncation and forks), ``sampler_chain``
(llama.cpp's sampler chain behind ``LlamaExecutor.sampler``).

Importing this package loads neither llama.cpp nor Ray; llama.cpp loads on first use.
"""

from .errors import ContextFullError, EngineError, SessionLimitError
from .executor import LlamaExecutor

__all__ = [
    "ContextFullError",
    "EngineError",
    "LlamaExecutor",
    "SessionLimitError",
]
