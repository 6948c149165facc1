"""kvres.testing: test doubles for code that runs without an engine or a cluster.

Primitives:
- ``ReferenceExecutor``: the executor contract in plain Python (a deterministic fake model), the
  yardstick of the conformance table.
- ``LocalStorePort``: a backend's store port over ``ColdStoreServer`` objects in this process.
- ``kl_divergence``, ``log_softmax``: comparing two engines' (or two runs') logits.
- ``family_models`` (imported by name): random-weight GGUFs with model families' own chat
  templates (``family_templates``).

Nothing in ``kvres.policy``, ``kvres.coldstore``, ``kvres.actors`` or ``kvres.cluster`` imports
this package.
"""

from .local_store import LocalStorePort
from .metrics import kl_divergence, log_softmax
from .reference_executor import REFERENCE_CAPABILITIES, ReferenceExecutor

__all__ = ["REFERENCE_CAPABILITIES", "LocalStorePort", "ReferenceExecutor", "kl_divergence", "log_softmax"]
