"""The llama.cpp executor in the conformance table (stories260K, one thread)."""

from kvres.actors.engines.llama import LlamaExecutor
from tests.conftest import shared_model_path

FACTORIES = {
    "llama": lambda: LlamaExecutor(shared_model_path(), n_ctx=1024, n_seq_max=4, n_threads=1),
}
