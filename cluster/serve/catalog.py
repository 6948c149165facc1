"""The models the HTTP front offers: one per distinct model file of the configured backends.

Primitives:
- ``ServedModel``: ``id`` (the model file's name without ``.gguf``; the file's parent folder's name
  joined with ``-`` where two files share a name), ``path``, ``backends`` (the backends that serve
  it), ``n_ctx`` (the most tokens one of its sessions can hold on those backends, the smallest: a
  backend's context, or where the sessions' policy keeps every token, its ``kv_budget_tokens`` and
  a split layout's stream where smaller; ``/v1/models``' ``context_length``), ``anchor`` (a control
  token of the model, read once from its file), ``trained_context`` (GGUF ``<arch>.context_length``,
  read once; None where unreadable here), ``local_decoder()`` (its vocabulary decoded in this
  process, where it can be), ``n_vocab`` (that vocabulary's size, or None), ``card()`` (the ``/v1/models`` entry).
- ``ModelCatalog(backends, keeps_every_token=True)``: ``models``, ``resolve(name) -> (model,
  backend or None)``: a model id (placement picks the backend) or a backend's name (that backend);
  anything else is a 404 naming the ids offered. ``default`` is the first backend's model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvres.actors.backend_setup.engine_registry import kv_layout_of
from kvres.actors.config import BackendConfig
from kvres.actors.default_model import default_model_path

from .http_errors import ApiError


@dataclass
class ServedModel:
    id: str
    path: Path
    backends: list[str] = field(default_factory=list)
    n_ctx: int = 0
    created: int = 0
    engines: set[str] = field(default_factory=set)
    _anchor: tuple[int | None] | None = field(default=None, repr=False)
    _trained: tuple[int | None] | None = field(default=None, repr=False)

    @property
    def trained_context(self) -> int | None:
        """The positions the model was trained on (GGUF ``<arch>.context_length``), read once from
        its file; None where the file cannot be read here (another node's path) or names none."""
        if self._trained is None:
            from kvres.actors.model_files import read_gguf_metadata

            try:
                meta = read_gguf_metadata(self.path)
                found = int(meta.get(f"{meta.get('general.architecture')}.context_length") or 0) or None
            except Exception:  # not on this node, or not a GGUF (an OpenVINO folder)
                found = None
            self._trained = (found,)
        return self._trained[0]

    @property
    def anchor(self) -> int | None:
        """A control token of the model (its BOS, else its EOS): decoded first, it reads as nothing
        and keeps llama.cpp from dropping the next token's leading space (``turns.InContext``). None
        where the file cannot be read here (another node's path) or names neither."""
        if self._anchor is None:
            from kvres.actors.chat_source import tokenizer_meta

            try:
                meta = tokenizer_meta(self.path)
            except Exception:  # the file is not on this node, or not a GGUF: decode after the prompt instead
                meta = {}
            found = next((meta[k] for k in ("bos_token_id", "eos_token_id") if meta.get(k) is not None), None)
            self._anchor = (None if found is None else int(found),)
        return self._anchor[0]

    def local_decoder(self) -> Callable[[Sequence[int]], str] | None:
        """Decoding in this process with llama.cpp's own call (``vocab.LocalVocab``) where every
        backend of the model is a llama.cpp one and the file is here; else None (ask a backend)."""
        if self.engines != {"llama"}:
            return None
        from .vocab import local_vocab

        vocab = local_vocab(str(self.path))
        return None if vocab is None else vocab.detokenize

    @property
    def n_vocab(self) -> int | None:
        """The model's vocabulary size where its file is read here by llama.cpp (``local_decoder``
        would decode with it); else None."""
        if self.engines != {"llama"}:
            return None
        from .vocab import local_vocab

        vocab = local_vocab(str(self.path))
        return None if vocab is None else vocab.n_vocab

    def card(self) -> dict[str, Any]:
        return {"id": self.id, "object": "model", "created": self.created, "owned_by": "kvres",
                "backends": list(self.backends), "context_length": self.n_ctx,
                "trained_context": self.trained_context}


def _model_id(path: Path, taken: set[str]) -> str:
    base = path.name.removesuffix(".gguf") or path.name
    if base not in taken:
        return base
    return f"{path.parent.name}-{base}"


def session_context(backend: BackendConfig, keeps_every_token: bool) -> int:
    """The most tokens one session can hold on ``backend`` (``kvres.actors.host.context_limit``):
    its context (a split layout's stream: ``n_ctx / n_seq_max``, the layout kvres chooses where the
    config leaves it, ``kvres.actors.backend_setup.kv_layout_choice``), and with a policy that keeps every
    token resident, the KV budget where smaller."""
    model = Path(backend.model_path or default_model_path())
    layout = kv_layout_of(backend, model, evicting_sessions=not keeps_every_token)
    split = layout is not None and layout.layout == "split"
    per_session = backend.n_ctx // backend.n_seq_max if split else backend.n_ctx
    return min(per_session, backend.kv_budget_tokens) if keeps_every_token else per_session


class ModelCatalog:
    def __init__(self, backends: Sequence[BackendConfig], keeps_every_token: bool = True) -> None:
        if not backends:
            raise ValueError("a model catalog needs at least one backend")
        by_path: dict[Path, ServedModel] = {}
        taken: set[str] = set()
        self.backend_names = {b.name for b in backends}
        for b in backends:
            path = Path(b.model_path or default_model_path()).resolve()
            model = by_path.get(path)
            if model is None:
                created = int(path.stat().st_mtime) if path.exists() else 0
                model = by_path[path] = ServedModel(_model_id(path, taken), path, created=created,
                                                    n_ctx=session_context(b, keeps_every_token))
                taken.add(model.id)
            model.backends.append(b.name)
            model.engines.add(b.engine)
            model.n_ctx = min(model.n_ctx, session_context(b, keeps_every_token))
        self.models = list(by_path.values())
        self.default = self.models[0]
        self._by_backend = {name: m for m in self.models for name in m.backends}
        self._by_id = {m.id: m for m in self.models}

    def resolve(self, name: object) -> tuple[ServedModel, str | None]:
        if isinstance(name, str):
            if name in self._by_id:
                return self._by_id[name], None
            if name in self._by_backend:
                return self._by_backend[name], name
        offered = sorted(self._by_id)
        raise ApiError(404, f"model {name!r} is not served here; the models are {offered} (or a backend's name: "
                       f"{sorted(self._by_backend)})", param="model", code="model_not_found")

    def of_backend(self, backend: str) -> ServedModel:
        return self._by_backend[backend]
