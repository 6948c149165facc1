"""What a backend can do.

Primitives:
- ``Capabilities``: what a backend advertises; everything defaults to "cannot", so a backend only
  states what it really supports. ``remove_middle`` / ``position_shift`` gate the planner's
  eviction and re-basing, ``kv_export`` gates spill and suspend (export / import of blocks),
  ``attention_capture`` a raw attention capture (the SnapKV and H2O scorers), ``key_access`` the resident keys (the attention-free KeyNorm scorer).
- ``CapabilityName``: the name of one of those fields (what a policy requires, what a gate lacks).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Literal

CapabilityName = Literal["remove_middle", "position_shift", "attention_capture", "key_access", "kv_export"]


@dataclass(frozen=True)
class Capabilities:
    remove_middle: bool = False
    position_shift: bool = False
    attention_capture: bool = False
    key_access: bool = False
    kv_export: bool = False

    def without(self, *names: CapabilityName) -> Capabilities:
        """A copy with the named boolean capabilities turned off."""
        known = {f.name for f in fields(self)}
        for name in names:
            if name not in known:
                raise ValueError(f"unknown capability {name!r}; known: {sorted(known)}")
        return replace(self, **{name: False for name in names})
