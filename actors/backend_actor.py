"""The backend as a Ray actor: a thin shell around ``BackendHost``.

Primitives:
- ``BackendServer(config, namespace)``: builds the executor, finds the planner and this node's
  cold store by name, and forwards: ``open_session``, ``append``, ``append_text``, ``generate``,
  ``stream`` (a Ray streaming generator: one object per token), ``suspend``, ``resume``,
  ``detach``, ``close``, ``session_stats``, ``stats``, ``tokenize``, ``detokenize``.
- ``BackendActor``: ``ray.remote(BackendServer)``; ``backend_actor_name(name)``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import ray

from .backend import BackendHost, ProbedRecallCosts, SuspendRecord
from .config import BackendConfig, SessionPolicy
from .default_model import default_model_path
from .engines import make_executor, resolve_kv_tier
from .metrics import RayMetrics
from .planner_actor import PLANNER_NAME
from .store_ports import RayStorePort, cold_store_name


def backend_actor_name(name: str) -> str:
    return f"kvres-backend-{name}"


class BackendServer:
    def __init__(self, config: BackendConfig, namespace: str) -> None:
        self.node_id = ray.get_runtime_context().get_node_id()
        planner: Any = ray.get_actor(PLANNER_NAME, namespace=namespace)
        model = config.model_path or default_model_path()
        config, self.tier_decision = resolve_kv_tier(config, model)
        store = RayStorePort(cold_store_name(self.node_id), namespace)
        self.host = BackendHost(
            config,
            make_executor(config, model),
            lambda inp: ray.get(planner.plan.remote(config.name, inp)),
            store,
            RayMetrics(),
            recall_costs=ProbedRecallCosts(str(model)) if config.engine == "llama" else None,
        )

    def ping(self) -> str:
        return self.node_id

    def open_session(self, session_id: str, policy: SessionPolicy | None = None) -> None:
        self.host.open_session(session_id, policy)

    def append(self, session_id: str, tokens: Sequence[int]) -> int:
        return self.host.append(session_id, tokens)

    def append_text(self, session_id: str, text: str) -> list[int]:
        add_bos = not self.host.executor.token_log(session_id)
        tokens = self.host.executor.tokenize(text, add_bos)
        self.host.append(session_id, tokens)
        return tokens

    def generate(self, session_id: str, max_tokens: int, temperature: float = 0.0,
                 seed: int | None = None) -> list[int]:
        return self.host.generate(session_id, max_tokens, temperature, seed)

    @ray.method(num_returns="streaming")
    def stream(self, session_id: str, max_tokens: int, temperature: float = 0.0,
               seed: int | None = None) -> Iterator[int]:
        yield from self.host.stream(session_id, max_tokens, temperature, seed)

    def suspend(self, session_id: str) -> None:
        self.host.suspend(session_id)

    def resume(self, session_id: str, record: SuspendRecord | None = None) -> int:
        return self.host.resume(session_id, record)

    def detach(self, session_id: str) -> SuspendRecord:
        return self.host.detach(session_id)

    def close(self, session_id: str) -> None:
        self.host.close(session_id)

    def session_stats(self, session_id: str) -> dict[str, Any]:
        return self.host.session_stats(session_id)

    def stats(self) -> dict[str, Any]:
        tier = self.tier_decision.as_dict() if self.tier_decision is not None else None
        return {**self.host.stats(), "node_id": self.node_id, "kv_types": (self.host.config.type_k,
                self.host.config.type_v), "tier_decision": tier}

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return self.host.executor.tokenize(text, add_bos)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.host.executor.detokenize(tokens)


BackendActor = ray.remote(BackendServer)
