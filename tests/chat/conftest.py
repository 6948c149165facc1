"""A local Ray cluster for the chat-ready session API: llama.cpp and OpenVINO on stories260K, the
passkey model (answers end with EOS), and the project's default model (its chat template)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import REPO_ROOT, shared_model_path

if TYPE_CHECKING:
    from kvres.actors.host.backend import BackendHost

PASSKEY_MODEL = REPO_ROOT / "models" / "passkey.gguf"


@pytest.fixture(scope="package")
def manager(tmp_path_factory: pytest.TempPathFactory):
    import ray

    from kvres.cluster import BackendConfig, ColdStoreConfig, KvresConfig, connect

    model = shared_model_path()
    config = KvresConfig(
        backends=[
            BackendConfig(name="b0", model_path=model, n_ctx=2048, n_seq_max=6, kv_budget_tokens=2000, n_threads=1),
            BackendConfig(name="b1", model_path=model, n_ctx=2048, n_seq_max=6, kv_budget_tokens=2000, n_threads=1),
            BackendConfig(name="ov", engine="openvino", model_path=model, n_ctx=2048, kv_budget_tokens=2000,
                          n_threads=1),
            BackendConfig(name="pk", model_path=PASSKEY_MODEL, n_ctx=1024, n_seq_max=4, kv_budget_tokens=1000,
                          n_threads=1),
            BackendConfig(name="chat", n_ctx=2048, n_seq_max=4, kv_budget_tokens=2000, n_threads=1,
                          kv_layout="unified"),  # streaming sessions evict in it
        ],
        cold_store=ColdStoreConfig(ram_budget_bytes=8 << 20, disk_budget_bytes=64 << 20,
                                   disk_dir=tmp_path_factory.mktemp("coldstore")),
    )
    if ray.is_initialized():
        ray.shutdown()
    mgr = connect(namespace=f"kvres-chat-{uuid.uuid4().hex[:8]}", config=config, num_cpus=2, include_dashboard=False)
    yield mgr
    mgr.shutdown()
    ray.shutdown()


def stories_chat_host(folder: Path, name: str, n_ctx: int, n_seq_max: int) -> Iterator[BackendHost]:
    """A backend host without Ray on stories260K with ``benchmarks.realistic_model``'s chat template
    (one thread, a KV budget of the whole context), shut down after its test."""
    from benchmarks.chat_fleet.sides import with_chat_template
    from benchmarks.realistic_model import CHAT_TEMPLATE
    from kvres.actors.backend_setup.engine_registry import make_executor
    from kvres.actors.config import BackendConfig
    from kvres.actors.host.backend import BackendHost

    model = with_chat_template(shared_model_path(), folder / "stories-chat.gguf", CHAT_TEMPLATE)
    cfg = BackendConfig(name=name, model_path=model, n_ctx=n_ctx, n_seq_max=n_seq_max, kv_budget_tokens=n_ctx,
                        n_threads=1)
    host = BackendHost(cfg, make_executor(cfg, model))
    yield host
    host.shutdown()
