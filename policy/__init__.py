"""kvres.policy: pure residency decisions (no Ray, no engine imports).

Primitives: ``Range``, ``Block``, ``BlockFlag``, ``Capabilities``, ``StreamPolicy``,
``PlanInput``, ``Plan``, ``plan_hot_set``; KV types in ``kvres.policy.kv_types``, capacity in
``kvres.policy.capacity``, score aggregation in ``kvres.policy.scoring``, T* in
``kvres.policy.tiering``, recall-or-recompute in ``kvres.policy.recall``, position rules in
``kvres.policy.positions``, per-backend planning in ``kvres.policy.backend_planner``, errors in
``kvres.policy.errors``. No I/O, no environment, no Ray, no engines: the executor contract that
carries these decisions out lives in ``kvres.actors.engines.executor``.
"""

from .blocks import PROTECTED_FLAGS, Block, BlockFlag, split_into_blocks
from .capabilities import Capabilities
from .errors import (
    ArgumentError,
    BlockMismatchError,
    CapabilityError,
    ContextLengthError,
    KvresError,
    ModelLoadError,
    RangeError,
    SessionExistsError,
    UnknownSessionError,
)
from .planner import Plan, PlanInput, StreamPolicy, plan_hot_set
from .ranges import Range, merge_ranges, subtract_range

__all__ = [
    "PROTECTED_FLAGS",
    "ArgumentError",
    "Block",
    "BlockFlag",
    "BlockMismatchError",
    "Capabilities",
    "CapabilityError",
    "ContextLengthError",
    "KvresError",
    "ModelLoadError",
    "Plan",
    "PlanInput",
    "Range",
    "RangeError",
    "SessionExistsError",
    "StreamPolicy",
    "UnknownSessionError",
    "merge_ranges",
    "plan_hot_set",
    "split_into_blocks",
    "subtract_range",
]
