"""A session carried out of a backend as one file, and into any backend of the same model.

Primitives:
- ``Portable(ctx, durability, resumption, kv, secret=None, model_id="")``:
  ``export(session_id) -> bytes``: the session's log, policy, last logits, the KV of its resident
  ranges (exported, not moved: the session runs on; ``kv.export_resident``, none where the engine
  cannot export it) and of its spilled blocks, encoded by
  ``kvres.coldstore.session_file`` under the cluster's block secret.
  ``restore(data, session_id=None) -> (session_id, recomputed)``: a new session from such bytes,
  opened suspended with its blocks parked in this backend's store and then resumed: blocks this
  engine cannot import (another KV type or engine) are recomputed from the log, like any block a
  resume cannot read.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from kvres.coldstore import KVBlock, validate_session_id
from kvres.coldstore.session_file import SessionImage, decode_session, encode_session
from kvres.policy import KvresError, SessionExistsError
from kvres.policy.tokens import token_ids

from ..config import SessionPolicy
from ..metrics import COUNTERS
from .context import HostContext
from .durability import Durability
from .journal import SessionRecord
from .kv_access import SessionKV
from .refusals import BackendFullError, SessionBusyError
from .resumption import Resumption
from .store_ports import ColdRef


@dataclass
class Portable:
    ctx: HostContext
    durability: Durability
    resumption: Resumption
    kv: SessionKV
    secret: bytes | None = None
    model_id: str = ""

    def export(self, session_id: str) -> bytes:
        ctx = self.ctx
        with ctx.lock:
            s = ctx.get(session_id, live=False)
            if ctx.jobs.pending(session_id):
                raise SessionBusyError(f"session {session_id!r} has a call running; export it after")
            if s.live:
                ranges = ctx.executor.resident_ranges(session_id)
                resident = self.kv.export_resident(session_id, ranges)
                log = list(ctx.executor.token_log(session_id))
            else:
                ranges, log = list(s.record.resident_ranges), list(s.record.token_log)
                resident = self._read(s.record.blocks)
            image = SessionImage(
                session_id, ctx.fingerprint, self.model_id, log, list(ranges), s.policy.model_dump(mode="json"),
                None if s.last_logits is None else np.asarray(s.last_logits, dtype=np.float32).tobytes(),
                s.exact, resident, self._read(s.cold),
            )
        return encode_session(image, self.secret)

    def _read(self, refs: list[ColdRef]) -> list[KVBlock]:
        store = self.ctx.store
        return [b for b in store.read(refs) if b is not None] if refs and store is not None else []

    def restore(self, data: bytes, session_id: str | None = None) -> tuple[str, int]:
        ctx = self.ctx
        image = decode_session(data, self.secret)
        sid = session_id or image.session_id
        validate_session_id(sid)
        if image.model_id and self.model_id and image.model_id != self.model_id:
            raise KvresError(f"session file of {image.session_id!r} was written for model {image.model_id!r}; "
                             f"backend {ctx.name!r} runs {self.model_id!r}")
        token_ids(image.token_log, ctx.executor.n_vocab, what="the session file's token log")
        policy = SessionPolicy.model_validate(image.policy)
        with ctx.lock:
            if sid in ctx.sessions or ctx.journal.load(sid) is not None:
                raise SessionExistsError(sid)
            store = ctx.store
            parked = store.park([replace(b, session_id=sid) for b in image.resident]) if store and image.resident else []
            cold = store.park([replace(b, session_id=sid) for b in image.cold]) if store and image.cold else []
            logits = None if image.last_logits is None else np.frombuffer(image.last_logits, dtype=np.float32).copy()
            record = SessionRecord(sid, image.token_log, image.resident_ranges, parked, cold, policy, logits,
                                   dict.fromkeys(COUNTERS, 0), ctx.fingerprint, backend=ctx.name,
                                   state="suspended", exact=image.exact)
            s = ctx.new_session(policy, record, parked=True)
            ctx.sessions[sid] = s
            self.durability.commit_new(sid)
            try:
                recomputed = self.resumption.resume(sid)
            except BackendFullError:
                recomputed = 0  # it stays suspended and comes in with its first call
            ctx.publish()
            return sid, recomputed
