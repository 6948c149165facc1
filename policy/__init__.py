"""kvres.policy: pure residency decisions (no Ray, no engine imports).

Primitives: ``Range``, ``Block``, ``BlockFlag``, ``CacheClass``, ``Capabilities``, ``StreamPolicy``,
``PlanInput``, ``Plan``, ``plan_hot_set``, ``Executor``, ``apply_plan``; capacity in
``kvres.policy.capacity``, score aggregation in ``kvres.policy.scoring``, errors in
``kvres.policy.errors``.
"""

from .blocks import PROTECTED_FLAGS, Block, BlockFlag, CacheClass, split_into_blocks
from .capabilities import Capabilities
from .errors import (
    BlockMismatchError,
    CapabilityError,
    KvresError,
    ModelLoadError,
    RangeError,
    SessionExistsError,
    UnknownSessionError,
)
from .executor import Executor, apply_plan
from .planner import Plan, PlanInput, StreamPolicy, plan_hot_set
from .ranges import Range, merge_ranges, subtract_range

__all__ = [
    "PROTECTED_FLAGS",
    "Block",
    "BlockFlag",
    "BlockMismatchError",
    "CacheClass",
    "Capabilities",
    "CapabilityError",
    "Executor",
    "KvresError",
    "ModelLoadError",
    "Plan",
    "PlanInput",
    "Range",
    "RangeError",
    "SessionExistsError",
    "StreamPolicy",
    "UnknownSessionError",
    "apply_plan",
    "merge_ranges",
    "plan_hot_set",
    "split_into_blocks",
    "subtract_range",
]
