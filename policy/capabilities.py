"""What a backend can do.

Primitives:
- ``Capabilities``: booleans (and one window size) a backend advertises; everything defaults to
  "cannot", so a backend only states what it really supports.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class Capabilities:
    remove_tail: bool = False
    remove_middle: bool = False
    position_shift: bool = False
    sparse_attention: bool = False
    sliding_window_tokens: int = 0
    cold_store: bool = False
    recompute_range: bool = False
    attention_scores: bool = False
    kv_export: bool = False

    def without(self, *names: str) -> Capabilities:
        """A copy with the named boolean capabilities turned off."""
        known = {f.name for f in fields(self)}
        for name in names:
            if name not in known:
                raise ValueError(f"unknown capability {name!r}; known: {sorted(known)}")
        return replace(self, **{name: False for name in names})
