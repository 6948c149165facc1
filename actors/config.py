"""Backend and session configuration (pydantic), the plain data the backend actors run on.

Primitives:
- ``SessionPolicy``: none / streaming (sink + recent) / scored (SnapKV, H2O or KeyNorm) / engine
  (let an openvino-genai backend evict with its own CacheEvictionConfig, SUM or NORM_SUM
  aggregation), block size, resident budget, spill (keep evicted blocks in the cold store) or drop;
  ``strict``: refuse at open what the backend cannot run as asked (by default a session degrades
  to the weaker policy the engine can run, ``kvres.policy.degrade``). The helpers ``streaming``,
  ``scored`` and ``engine_evicts`` take every field their kind uses. ``residency``: the residency
  object the policy stands for (``kvres.policy.residency.make_residency``), what everything after
  the configuration asks; the kind and scorer names are ``kvres.policy``'s (``PolicyKind``,
  ``ScorerName``). Retention, the owner's say in what is kept
  (``with_retention``): ``priority`` (suspended and evicted for others' room later than lower
  ones), ``pin`` (never, within the backend's ``max_pinned_tokens``), ``idle_suspend_s`` (parked
  after that long without a call), ``ttl_s`` (closed after that long without a call) and
  ``tool_pause_s`` (how long a session whose turn ended in tool calls is parked after the idle ones
  while its results are on their way, ``kvres.policy.backend_planner.keep_key``; 0: not at all); ``tenant``,
  the label whose quota on a backend (``BackendConfig.tenant_quotas``) the session counts against.
- ``TenantQuota``: what one tenant's sessions may hold on a backend together: ``resident_tokens``
  and ``cold_bytes`` (None: no limit); ``kvres.actors.host.quotas`` keeps them.
- ``BackendConfig``: engine, model path, n_ctx, KV budget, KV types (``kvres.policy.kv_types``),
  the llama.cpp KV layout (``kv_layout``: one cache for all sessions, or one stream each; None,
  the default: kvres chooses from the backend's sizes, ``kvres.actors.backend_setup.kv_layout_choice``)
  and ``flash_attn`` (None: on, except for the split layout on the CPU), threads, GPUs and device
  placement (``n_gpu_layers``, ``openvino_device``); the KV budget in memory instead of tokens
  (``kv_memory_bytes`` and / or ``kv_memory_fraction`` of the free device or host memory, less
  ``kv_memory_reserve_bytes``; ``memory_budgeted``): the backend then resolves ``n_ctx`` and
  ``kv_budget_tokens`` from the model's KV profile (``kvres.actors.backend_setup.kv_budget``), and an
  explicit ``n_ctx`` / ``kv_budget_tokens`` only caps them; ``max_pinned_tokens``, what pinned
  sessions may hold under their pins; ``tenant_quotas``, per tenant label; ``max_room_wait_s`` and
  ``max_waiting_calls``: how long, and how many, calls that cannot get room wait for it (first
  come, first served within a priority) before they are refused (``BackendFullError`` with a
  retry-after hint; HTTP 429 with ``Retry-After``).

Every bad value is a ``pydantic.ValidationError`` (a ValueError) whose message names the field.
Drivers import both from ``kvres.cluster``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvres.policy.kv_types import KVType, flash_attn_for
from kvres.policy.residency import Aggregation, PolicyKind, Residency, make_residency
from kvres.policy.scorers import ScorerName

DEFAULT_KV_MEMORY_RESERVE = 256 * 1024 * 1024  # compute buffers and the rest of the process
TENANT_PATTERN = r"^[A-Za-z0-9_.:@-]{1,64}$"


class SessionPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: PolicyKind = "none"
    scorer: ScorerName = "snapkv"  # kind="scored": kvres.policy.scorers
    aggregation: Aggregation = "NORM_SUM"  # kind="engine" only
    block_size: int = Field(16, ge=1, le=4096)
    budget_tokens: int | None = Field(None, ge=1)
    sink_tokens: int = Field(4, ge=0)
    recent_tokens: int = Field(64, ge=0)
    observation_window: int = Field(16, ge=1, le=4096)
    rebase: bool = True  # close position gaps after eviction (False: keep them)
    spill: bool = True
    spill_cap_bytes: int | None = Field(None, ge=0)  # most a session keeps spilled; oldest out first
    strict: bool = False  # refuse at open what the backend cannot run as asked, instead of degrading
    # retention, set by the session's owner (``with_retention``): kvres.actors.host.retention
    priority: int = Field(0, ge=-100, le=100)  # higher: suspended and evicted for others later
    pin: bool = False  # never suspended or evicted for others' room (within the backend's max_pinned_tokens)
    idle_suspend_s: float | None = Field(None, gt=0)  # parked after this long without a call
    ttl_s: float | None = Field(None, gt=0)  # closed (its blocks deleted) after this long without a call
    tool_pause_s: float = Field(30.0, ge=0, le=86400)  # paused for tools: parked after idle sessions this long
    tenant: str | None = Field(None, pattern=TENANT_PATTERN)  # whose quota it counts against (None: no one's)

    @model_validator(mode="after")
    def _budget_fits_protected(self) -> SessionPolicy:
        if self.residency.keeps_every_token:
            return self
        if self.budget_tokens is None:
            raise ValueError(f"budget_tokens is required for a {self.kind!r} policy")
        floor = self.sink_tokens + self.recent_tokens + self.block_size
        if self.budget_tokens < floor:
            raise ValueError(
                f"budget_tokens={self.budget_tokens} is smaller than sink_tokens "
                f"({self.sink_tokens}) + recent_tokens ({self.recent_tokens}) + one block "
                f"({self.block_size}) = {floor}"
            )
        return self

    @property
    def residency(self) -> Residency:
        """The residency object this policy stands for: the one place a ``SessionPolicy`` becomes
        one (degraded to what an engine can run by ``kvres.policy.degrade.effective_residency``)."""
        return make_residency(
            self.kind, scorer=self.scorer, aggregation=self.aggregation, sink_tokens=self.sink_tokens,
            recent_tokens=self.recent_tokens, block_size=self.block_size, budget_tokens=self.budget_tokens,
            rebase=self.rebase, spill=self.spill, observation_window=self.observation_window,
        )

    def with_retention(self, priority: int | None = None, pin: bool | None = None,
                       idle_suspend_s: float | None = None, ttl_s: float | None = None,
                       tenant: str | None = None, tool_pause_s: float | None = None) -> SessionPolicy:
        """This policy with the retention fields given (the others as they are), validated."""
        fields = {"priority": priority, "pin": pin, "idle_suspend_s": idle_suspend_s, "ttl_s": ttl_s,
                  "tenant": tenant, "tool_pause_s": tool_pause_s}
        return SessionPolicy.model_validate({**self.model_dump(), **{k: v for k, v in fields.items() if v is not None}})

    @classmethod
    def streaming(cls, budget_tokens: int, sink_tokens: int = 4, recent_tokens: int = 64,
                  block_size: int = 16, spill: bool = True, rebase: bool = True, observation_window: int = 16,
                  spill_cap_bytes: int | None = None, strict: bool = False) -> SessionPolicy:
        """Sinks + the recent window (StreamingLLM), evicted block by block as the session grows;
        ``rebase=False`` keeps position gaps; ``observation_window``: the rows a recall turn ranks
        cold blocks by."""
        return cls(kind="streaming", budget_tokens=budget_tokens, sink_tokens=sink_tokens,
                   recent_tokens=recent_tokens, block_size=block_size, spill=spill, rebase=rebase,
                   observation_window=observation_window, spill_cap_bytes=spill_cap_bytes, strict=strict)

    @classmethod
    def engine_evicts(cls, budget_tokens: int, sink_tokens: int = 4, recent_tokens: int = 64,
                      aggregation: Aggregation = "NORM_SUM") -> SessionPolicy:
        """Let the engine evict (openvino-genai backends): its CacheEvictionConfig keeps
        ``sink_tokens`` + ``recent_tokens`` and the highest-scoring blocks up to the budget."""
        return cls(kind="engine", budget_tokens=budget_tokens, sink_tokens=sink_tokens,
                   recent_tokens=recent_tokens, aggregation=aggregation)

    @classmethod
    def scored(cls, budget_tokens: int, scorer: ScorerName = "snapkv",
               sink_tokens: int = 4, recent_tokens: int = 64, block_size: int = 16,
               spill: bool = True, observation_window: int = 16, rebase: bool = True,
               spill_cap_bytes: int | None = None, strict: bool = False) -> SessionPolicy:
        """Compress after prefill: an append is prefilled (in chunks as large as the backend's
        free room) and the session then cut to ``budget_tokens`` by the scorer (SnapKV: the
        attention of the append's last ``observation_window`` tokens; H2O: the attention every
        processed row gave; keynorm: the keys' L2 norms); a generate at its end (and whenever the
        session reaches twice its budget). ``rebase=False`` keeps position gaps."""
        return cls(kind="scored", scorer=scorer, budget_tokens=budget_tokens,
                   sink_tokens=sink_tokens, recent_tokens=recent_tokens, block_size=block_size,
                   spill=spill, observation_window=observation_window, rebase=rebase,
                   spill_cap_bytes=spill_cap_bytes, strict=strict)


class TenantQuota(BaseModel):
    """What the sessions of one tenant label hold on a backend together (None: no limit).
    ``resident_tokens``: their KV on the engine; past it, the tenant's own idle sessions are
    suspended and its evicting ones shrunk first, and a call that still does not fit is refused
    (``TenantQuotaError``). ``cold_bytes``: their spilled blocks and parked states in the cold
    store; past it, the tenant's oldest cold data is dropped (its tokens stay in the logs and are
    recomputed when needed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    resident_tokens: int | None = Field(None, ge=0)
    cold_bytes: int | None = Field(None, ge=0)


class BackendConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("backend-0", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    engine: Literal["llama", "openvino", "openvino-genai"] = "llama"
    model_path: Path | None = None  # None: the project's default model
    n_ctx: int = Field(4096, ge=64, le=1 << 20)
    n_seq_max: int = Field(8, ge=1, le=64)
    kv_budget_tokens: int = Field(2048, ge=16)
    type_k: KVType = "f16"
    type_v: KVType = "f16"
    n_threads: int | None = Field(None, ge=1, le=256)
    num_gpus: float = Field(0.0, ge=0.0)
    node_id: str | None = None  # pin the backend to this Ray node
    openvino_mode: Literal["state", "recompute"] = "state"
    # llama.cpp only: "split" gives each session a KV stream of n_ctx / n_seq_max cells that only its
    # tokens attend over (faster with many resident sessions; no eviction from a session's middle).
    # None: kvres chooses when the backend starts: split from 4 sessions with streams of 512 tokens
    # or more (no sliding window, no spilling KV tier, a cluster default policy that keeps every
    # token), else unified (backend_setup.kv_layout_choice)
    kv_layout: Literal["unified", "split"] | None = None
    # llama.cpp only: flash attention (None: on, except the split layout on the CPU; a quantized V
    # cache needs it). Its blocks store V rows another way, so they move only between backends
    # with the same setting (a session moving elsewhere is recomputed from its log)
    flash_attn: bool | None = None
    # device placement: llama.cpp layers to offload (None: all when Ray gives the actor GPUs, else 0)
    n_gpu_layers: int | None = Field(None, ge=0, le=100_000)
    openvino_device: str = Field("CPU", pattern=r"^[A-Z]+(\.[0-9A-Za-z_]+)?(:[A-Z0-9.,]+)?$")
    # the KV budget as memory (either or both; both: the smaller)
    kv_memory_bytes: int | None = Field(None, ge=1)
    kv_memory_fraction: float | None = Field(None, gt=0.0, le=1.0)
    kv_memory_reserve_bytes: int = Field(DEFAULT_KV_MEMORY_RESERVE, ge=0)
    # resident tokens pinned sessions may hold under their pin (None: half of kv_budget_tokens)
    max_pinned_tokens: int | None = Field(None, ge=0)
    # per tenant label (SessionPolicy.tenant): what its sessions may hold here together
    tenant_quotas: dict[str, TenantQuota] = Field(default_factory=dict)
    # a call that cannot get room now waits for it this long (0: refused at once), first come first
    # served within a priority; at most this many wait at once (one more is refused at once)
    max_room_wait_s: float = Field(60.0, ge=0.0, le=3600.0)
    max_waiting_calls: int = Field(256, ge=0, le=1 << 16)

    @property
    def memory_budgeted(self) -> bool:
        """The KV budget is given in memory: n_ctx and kv_budget_tokens are resolved from it."""
        return self.kv_memory_bytes is not None or self.kv_memory_fraction is not None

    @model_validator(mode="after")
    def _check(self) -> BackendConfig:
        if self.n_ctx % 2:
            raise ValueError(f"n_ctx must be even, got {self.n_ctx}")
        resolved_later = self.memory_budgeted and "n_ctx" not in self.model_fields_set  # n_ctx from the memory
        if self.kv_budget_tokens > self.n_ctx and not resolved_later:
            raise ValueError(
                f"kv_budget_tokens={self.kv_budget_tokens} exceeds n_ctx={self.n_ctx}"
            )
        if self.kv_layout == "split" and self.engine != "llama":
            raise ValueError(f"kv_layout='split' is a llama.cpp layout; engine={self.engine!r} has none")
        if self.flash_attn is not None and self.engine != "llama":
            raise ValueError(f"flash_attn={self.flash_attn} is a llama.cpp setting; engine={self.engine!r} has none")
        flash_attn_for(self.type_v, self.flash_attn)  # a quantized V cache without it fails here, before any actor
        for tenant in self.tenant_quotas:
            if not re.fullmatch(TENANT_PATTERN, tenant):
                raise ValueError(f"tenant_quotas key {tenant!r} is not a tenant label (1-64 of A-Z a-z 0-9 _ . : @ -)")
        if self.model_path is not None and not Path(self.model_path).is_file():
            raise ValueError(f"model_path {str(self.model_path)!r} does not exist")
        return self
