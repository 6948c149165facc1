"""Ray's nodes as kvres sees them, and the names of their cold stores.

Primitives:
- ``STORE_PREFIX``; ``cold_store_name(node_id)``: the actor name of a node's cold store.
- ``alive_nodes()``: the ids of the Ray nodes alive now (asked of the GCS at most every
  ``NODES_TTL_S``); ``node_dead(node_id, fresh=False, unknown=True)``: no alive node has that id
  (or prefix); ``store_node_dead(store)``: the node a store is named after is dead (remembered: a
  store whose node died is never asked again).
"""

from __future__ import annotations

import time

import ray

STORE_PREFIX = "kvres-coldstore-"
NODES_TTL_S = 0.5
_nodes_seen: tuple[float, frozenset[str], frozenset[str]] = (0.0, frozenset(), frozenset())
_gone_stores: set[str] = set()  # stores whose node died: never asked again


def cold_store_name(node_id: str) -> str:
    return f"{STORE_PREFIX}{node_id[:16]}"


def _nodes(fresh: bool = False) -> tuple[frozenset[str], frozenset[str]]:
    """(alive, dead) node ids, as the GCS says (cached ``NODES_TTL_S`` unless ``fresh``)."""
    global _nodes_seen
    now = time.monotonic()
    if fresh or now - _nodes_seen[0] > NODES_TTL_S:
        table = ray.nodes()  # type: ignore[no-untyped-call]
        alive = frozenset(str(n["NodeID"]) for n in table if n.get("Alive"))
        dead = frozenset(str(n["NodeID"]) for n in table if not n.get("Alive"))
        _nodes_seen = (now, alive, dead)
    return _nodes_seen[1], _nodes_seen[2]


def alive_nodes() -> frozenset[str]:
    return _nodes()[0]


def node_dead(node_id: str, fresh: bool = False, unknown: bool = True) -> bool:
    """``node_id`` (or a prefix of it, as store names hold) names no alive node and a dead one;
    with ``unknown`` also none at all (a node kvres pinned something to, or named a store after,
    existed: gone from Ray's node table, it is dead too)."""
    alive, dead = _nodes(fresh)
    if any(n.startswith(node_id) for n in alive):
        return False
    return unknown or any(n.startswith(node_id) for n in dead)


def store_node_dead(store: str) -> bool:
    if store in _gone_stores:
        return True
    if store.startswith(STORE_PREFIX) and node_dead(store[len(STORE_PREFIX):]):
        _gone_stores.add(store)
        return True
    return False
