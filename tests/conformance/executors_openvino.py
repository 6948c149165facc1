"""The OpenVINO executor in the conformance table, in both mechanisms, on stories260K.gguf.

"openvino-recompute" gets a dict-backed block store, so it advertises remove_middle / position_shift.
"""

from kvres.actors.openvino import OpenVINOExecutor
from tests.conftest import shared_model_path
from tests.openvino.dict_store import DictBlockStore

FACTORIES = {
    "openvino-state": lambda: OpenVINOExecutor(shared_model_path(), mode="state"),
    "openvino-recompute": lambda: OpenVINOExecutor(
        shared_model_path(), mode="recompute", cold_store=DictBlockStore()
    ),
}
