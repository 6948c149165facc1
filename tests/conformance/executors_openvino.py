"""The OpenVINO executor in the conformance table, in both mechanisms, on stories260K.gguf."""

from kvres.actors.engines.openvino import openvino_executor
from tests.conftest import shared_model_path

FACTORIES = {
    "openvino-state": lambda: openvino_executor(shared_model_path(), mode="state"),
    "openvino-recompute": lambda: openvino_executor(shared_model_path(), mode="recompute"),
}
