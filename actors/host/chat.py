"""A conversation on a session: the model's chat template over the messages, and only what the
session does not hold yet appended.

Primitives:
- ``Chat(ctx)``: ``plan(session_id, messages, add_generation_prompt=True) -> (keep, tokens)``: the
  conversation rendered with the model's template (``kvres.actors.tools.rendering``: tools and
  tool turns included, the model's own way); the session
  keeps the first ``keep`` tokens of its log and appends ``tokens``. When the log, read back as
  text (control tokens included), is a prefix of the rendering, that is the whole log and only the
  rest is tokenized; otherwise the log is kept up to where it agrees with the rendering tokenized
  whole (a reply the caller edited, or tokens a generation chose differently), and the rest is
  replaced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvres.policy import CapabilityError

from ..chat_template import ChatMessage
from ..tools.rendering import render_conversation
from .context import HostContext


class Chat:
    def __init__(self, ctx: HostContext) -> None:
        self.ctx = ctx

    def plan(
        self, session_id: str, messages: Sequence[Mapping[str, Any] | ChatMessage], add_generation_prompt: bool = True,
    ) -> tuple[int, list[int]]:
        ctx = self.ctx
        source = ctx.executor.chat_template()
        if source is None:
            raise CapabilityError(f"backend {ctx.name!r}'s model has no chat template: append text instead")
        rendered = render_conversation(source, messages, add_generation_prompt)
        with ctx.lock:
            log = ctx.token_log(session_id)
        executor = ctx.executor
        body = log[1:] if log and source.add_bos and log[0] == source.bos_id else log
        said = executor.detokenize(body, special=True)
        if rendered.startswith(said):
            rest = rendered[len(said):]
            return len(log), executor.tokenize(rest, add_bos=not log and source.add_bos, special=True) if rest else []
        whole = executor.tokenize(rendered, add_bos=source.add_bos, special=True)
        keep = 0
        for mine, theirs in zip(log, whole, strict=False):
            if mine != theirs:
                break
            keep += 1
        return keep, whole[keep:]
