"""kvres.actors.engines.llama: the llama.cpp backend, and the one binding of llama-cpp-python in kvres.

Primitives:
- ``LlamaExecutor`` (``llama_executor``): the executor contract
  (``kvres.actors.engines.executor.Executor``) on one llama.cpp context shared by many sessions.
- ``ContextFullError``, ``SessionLimitError``, ``EngineError`` (``llama_errors``): this backend's
  typed errors.
- ``engine``: ``LlamaModel`` and ``LlamaContext``, the low-level API every llama.cpp user in the
  tree (probes, benchmarks, model evaluation) builds on. The modules that call llama.cpp or ggml
  (ctypes): ``engine``, ``library`` (llama.cpp loaded once, its log routed), ``ggml_tensors``
  (tensor reads, f16 converters); ``decode_threads`` says which thread decodes with ``n_threads``.

The executor's parts: ``cache_shape`` (the context it asks for, what sizing prices),
``executor_args`` (its arguments checked), ``context_setup`` (the context, its cell operations and
capabilities opened), ``sequence_slots`` (which sequence each session holds), ``cache_ops``
(cell-level operations on the context; ``stream_ops`` in the split layout, with
``stream_batches``), ``session``, ``blocks`` (the KV block format and its checks), ``state_blob``
(state blobs as arrays), ``recall_exchange`` (cold blocks scored and exchanged in numpy, with
``rope`` and ``quant_rows``), ``attention`` (the scoring context), ``edits`` (truncation and
forks), ``sampler_chain`` (llama.cpp's sampler chain behind ``LlamaExecutor.sampler``).

Importing this package loads neither llama.cpp nor Ray; llama.cpp loads on first use.
"""

from .llama_errors import ContextFullError, EngineError, SessionLimitError
from .llama_executor import LlamaExecutor

__all__ = [
    "ContextFullError",
    "EngineError",
    "LlamaExecutor",
    "SessionLimitError",
]
