"""A dict-backed block store for tests: the smallest thing that satisfies ``BlockParking``.

Primitives:
- ``DictBlockStore``: ``put(block) -> key`` (session, start, end), ``get(key)``, ``puts`` counter.
"""

from __future__ import annotations

from kvres.coldstore.block import KVBlock


class DictBlockStore:
    def __init__(self) -> None:
        self.blocks: dict[tuple[str, int, int], KVBlock] = {}
        self.puts = 0

    def put(self, block: KVBlock) -> tuple[str, int, int]:
        key = (block.session_id, block.token_range.start, block.token_range.end)
        self.blocks[key] = block
        self.puts += 1
        return key

    def get(self, key: tuple[str, int, int]) -> KVBlock:
        return self.blocks[key]
