"""The reference executor in the conformance table."""

from kvres.testing import ReferenceExecutor

FACTORIES = {"reference": lambda: ReferenceExecutor(vocab_size=64)}
