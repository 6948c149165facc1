"""One's own GGUF served or chatted with, no JSON: ``kvres serve --model`` and ``kvres chat --model``.

Primitives:
- ``ModelChoiceError``: the ``--model`` given cannot be served (no such file, not a GGUF, no chat
  template): one line saying what is wrong and what to do (the command line exits 2).
- ``check_chat_model(path) -> Path``: the file exists, is a GGUF kvres can read, and carries a
  chat template; else a ``ModelChoiceError``.
- ``chat_setup(path, kv_memory_bytes=None, sessions=CHAT_SESSIONS, n_threads=None) -> ChatSetup``: the
  ``KvresConfig`` a chat server of that model runs. One llama.cpp backend with the split layout
  (a KV stream per resident session: no turn attends over the others' cells; a model with a
  sliding window, which the split layout is not for, runs unified, each session capped at the
  same context), ``sessions`` streams, each as long as the model's trained context (GGUF ``<arch>.context_length``) where
  the memory holds that, else what it holds; the KV memory is ``kv_memory_bytes``, else
  ``KV_MEMORY_FRACTION`` of the free memory of llama.cpp's first GPU (the backend then takes it)
  or of host RAM, less the weights and the reserve (``kvres.actors.backend_setup.kv_budget``, the
  T0 sizing: windowed layers billed their window). The default policy keeps every token (kind
  ``none``): a reply attends over the whole conversation, and a session is refused
  (``context_length_exceeded``) past its context rather than forgetting its start. The engine's
  CPU threads are ``n_threads``, else the backend's default (its machine's cores, at most 4).
- ``check_threads(n) -> int``: ``--threads`` checked (1..``MAX_THREADS``), a ``ModelChoiceError``
  naming the value otherwise.
- ``ChatSetup``: ``config``, ``choices`` (``what: value`` lines), ``summary(command)`` (the
  block printed at start), ``session_context`` (the tokens one session holds, prompt and reply).

The context and token budget are resolved here, in the command's process, and given to the
backend as explicit numbers, so ``/v1/models`` states what a session really gets.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.policy.capacity import CapacityError
from kvres.policy.errors import KvresError, ModelLoadError
from kvres.policy.kv_layout import LLAMA_CELL_PAD

from .kvres_config import KvresConfig

CHAT_SESSIONS = 8
KV_MEMORY_FRACTION = 0.5
MIN_SESSION_CONTEXT = 64
NO_TRAINED_CONTEXT = 4096  # a file that names no trained context: llama.cpp's usual default
MiB = 1024 * 1024
MAX_THREADS: int = next(bound.le for bound in BackendConfig.model_fields["n_threads"].metadata if hasattr(bound, "le"))


class ModelChoiceError(KvresError, ValueError):
    """The model given on the command line cannot be served; the message says what to do."""


def check_chat_model(path: str | os.PathLike[str]) -> Path:
    from kvres.actors.chat_source import read_chat_template
    from kvres.actors.model_files import GGUF_MAGIC, open_gguf

    p = Path(path).expanduser()
    if p.is_dir():
        raise ModelChoiceError(f"--model {os.fspath(path)!r} is a folder: give the path of a .gguf file in it")
    if not p.is_file():
        raise ModelChoiceError(f"--model {os.fspath(path)!r}: no such file; give the path of a .gguf model file "
                               "(e.g. one downloaded from Hugging Face)")
    with p.open("rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise ModelChoiceError(f"--model {os.fspath(path)!r} is not a GGUF file (it starts with {magic!r}, not "
                               f"{GGUF_MAGIC!r}): convert it with llama.cpp's convert_hf_to_gguf.py, or download "
                               "a .gguf build of the model")
    try:
        open_gguf(p)
        template = read_chat_template(p)
    except ModelLoadError as exc:
        raise ModelChoiceError(f"--model {os.fspath(path)!r} is a damaged GGUF file ({_one_line(exc)}): "
                               "download it again") from None
    if template is None:
        raise ModelChoiceError(f"--model {os.fspath(path)!r} has no chat template (tokenizer.chat_template): use "
                               "the instruct / chat build of the model, or add a template to the file with "
                               "gguf's gguf_new_metadata.py --chat-template-file; a base model can still be "
                               "served raw with --config (POST /v1/completions)")
    return p.resolve()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def check_threads(n: int) -> int:
    if not 1 <= n <= MAX_THREADS:
        raise ModelChoiceError(f"--threads must be in 1..{MAX_THREADS} (the engine's CPU threads), got {n}")
    return n


def _backend_name(path: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", path.name.removesuffix(".gguf"))[:64].strip("-.")
    return name or "model"


@dataclass(frozen=True)
class ChatSetup:
    config: KvresConfig
    session_context: int
    choices: list[tuple[str, str]] = field(default_factory=list)

    def summary(self, command: str = "kvres") -> str:
        width = max(len(what) for what, _ in self.choices)
        name = Path(self.config.backends[0].model_path or "?").name
        return "\n".join([f"{command}: chosen for {name}:",
                          *(f"  {what:<{width}}  {value}" for what, value in self.choices)])


def _mib(n: float) -> str:
    return f"{n / MiB:,.0f} MiB" if n >= 10 * MiB else f"{n / MiB:,.1f} MiB"


def chat_setup(path: str | os.PathLike[str], kv_memory_bytes: int | None = None,
               sessions: int = CHAT_SESSIONS, n_threads: int | None = None) -> ChatSetup:
    from kvres.actors.backend_setup.kv_budget import MAX_N_CTX, memory_budget, resolve_kv_memory
    from kvres.actors.backend_setup.kv_layout_choice import has_sliding_window
    from kvres.actors.model_files import read_gguf_metadata
    from kvres.actors.sizing.device_memory import host_memory, llama_gpu_memory

    if n_threads is not None:
        check_threads(n_threads)
    model = check_chat_model(path)
    meta = read_gguf_metadata(model)
    arch = str(meta.get("general.architecture") or "?")
    trained = int(meta.get(f"{arch}.context_length") or 0)
    wanted = min(trained or NO_TRAINED_CONTEXT, MAX_N_CTX // sessions)
    wanted -= wanted % 2
    gpu = llama_gpu_memory(0)
    device = gpu or host_memory()
    memory: dict[str, object] = ({"kv_memory_bytes": kv_memory_bytes} if kv_memory_bytes is not None
                                 else {"kv_memory_fraction": KV_MEMORY_FRACTION})
    windowed = has_sliding_window(model)
    base = BackendConfig(name=_backend_name(model), model_path=model, kv_layout="unified" if windowed else "split",
                         n_seq_max=sessions,
                         n_ctx=wanted * sessions, kv_budget_tokens=wanted * sessions,
                         num_gpus=1.0 if gpu is not None else 0.0, n_threads=n_threads,
                         **memory)  # type: ignore[arg-type]
    budget, source = memory_budget(base, model, device=device)
    try:
        resolved, grant = resolve_kv_memory(base, model, budget, source=source)
    except CapacityError as exc:
        raise ModelChoiceError(f"{_one_line(exc)}: give more with --kv-memory") from None
    per_session = min(wanted, resolved.n_ctx // sessions)
    per_session -= per_session % (LLAMA_CELL_PAD if wanted > per_session >= LLAMA_CELL_PAD else 2)
    if per_session < MIN_SESSION_CONTEXT:
        raise ModelChoiceError(
            f"a KV memory of {_mib(grant.budget_bytes)} holds {max(per_session, 0)} tokens per session of {model.name} "
            f"for {sessions} sessions; at least {MIN_SESSION_CONTEXT} are needed: give more with --kv-memory")
    n_ctx = per_session * sessions
    backend = BackendConfig.model_validate({
        **base.model_dump(exclude_unset=True, exclude={"kv_memory_bytes", "kv_memory_fraction"}),
        "n_ctx": n_ctx, "kv_budget_tokens": min(resolved.kv_budget_tokens, per_session if windowed else n_ctx),
    })
    config = KvresConfig(backends=[backend], default_policy=SessionPolicy())
    if kv_memory_bytes is not None:
        where = f"{_mib(grant.budget_bytes)} (--kv-memory)"
    else:
        where = (f"{_mib(grant.budget_bytes)}: {KV_MEMORY_FRACTION:.0%} of the free {device.description} "
                 f"({_mib(device.free_bytes)}) less the weights ({_mib(grant.used_bytes)}) and a "
                 f"{_mib(grant.reserve_bytes)} reserve (--kv-memory sets it)")
    if not trained:
        trained_text = f"names no trained context ({arch}.context_length): {NO_TRAINED_CONTEXT} assumed"
    else:
        trained_text = f"trained on {trained:,} positions, {arch}.context_length"
    why = ("its trained context" if per_session >= (trained or NO_TRAINED_CONTEXT)
           else "what the KV memory holds for every stream" if per_session < wanted
           else f"the most one backend's context takes ({MAX_N_CTX:,} / {sessions} streams)")
    choices = [
        ("model", f"{model} ({arch}, {trained_text}; its own chat template)"),
        ("device", f"{gpu.description} (all layers offloaded)" if gpu is not None else "CPU (no GPU llama.cpp can use)"),
        ("KV memory", where),
        ("threads", f"{n_threads} engine thread{'s' if n_threads != 1 else ''} (--threads)" if n_threads is not None else
                    "the backend's machine's cores, at most 4 (--threads sets it)"),
        ("context", f"{per_session:,} tokens per session, prompt and reply together ({why})"),
        ("layout", f"unified: the model has a sliding window (llama.cpp's split streams are not for one); {sessions} "
                   f"sessions share the KV cells, each up to its context (KV {backend.type_k}/{backend.type_v}); "
                   "more sessions wait parked in the cold store while idle" if windowed else
                   f"split: {sessions} sessions resident at once, a KV stream each (KV {backend.type_k}/"
                   f"{backend.type_v}); more sessions wait parked in the cold store while idle"),
        ("policy", "none: every token of a conversation stays resident; a turn past the context is refused "
                   "(context_length_exceeded) instead of forgetting the conversation's start"),
    ]
    return ChatSetup(config, per_session, choices)
