"""A conversation on a session: the model's chat template over the messages, and only what the
session does not hold yet appended.

Primitives:
- ``Chat(ctx)``: ``plan(session_id, messages, add_generation_prompt=True) -> (keep, tokens)``: the
  conversation rendered with the model's template (``kvres.actors.tools.rendering``: tools and
  tool turns included, the model's own way); the session
  keeps the first ``keep`` tokens of its log and appends ``tokens``. When the log, read back as
  text (control tokens included), is a prefix of the rendering, that is the whole log and only the
  rest is tokenized; where it reads as a start of the rendering's own tokens read back (a reply the
  model wrote in other tokens than its text tokenizes to, a tokenizer's space after a control
  token), the whole log is kept and the rendering's tokens after that point appended; otherwise the log is kept up to the longer of where it still reads as the
  rendering (``_agreeing_text``: its generated tokens kept, as long as the rest tokenized after it
  reads back exactly) and where it agrees with the rendering tokenized whole, and the rest is
  replaced (a reply the caller edited, a turn the client never saw); where that drops tokens of
  the log, where and why is noted on the session (``HostSession.prefix_break``,
  ``prefix_break.describe_break``) for the turn's answer (``note``).
- ``Chat.plan_on(log, messages, add_generation_prompt=True) -> ChatPlan``: the same for a given log,
  reading nothing else of the host (no lock): ``ChatPlan(log, keep, tokens, prefix_break)``.
- ``Chat.plan_ahead(session_id, messages) -> ChatPlan | None`` (without the lock, on the log of the
  session's last commit) and ``plan_checked(session_id, messages, planned) -> (keep, tokens,
  log length)`` (under it: ``planned`` where the log is still the one it was made on, else planned
  again): a turn's plan made while the step loop runs on, used where nothing changed the log.
- ``first_true(lo, hi, guess, holds) -> int``: the least point of ``[lo, hi]`` where a monotone
  ``holds`` is true, searched outward from ``guess`` (where the log's text ends in the rendering's
  tokens: near the log's own length, so a few detokenizations of the conversation, not ~log2 of it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvres.policy import CapabilityError

from ..chat_template import ChatMessage
from ..tools.rendering import render_conversation
from .context import HostContext
from .prefix_break import describe_break


@dataclass(frozen=True)
class ChatPlan:
    """What a conversation asks of a session whose log was ``log``: keep its first ``keep`` tokens,
    append ``tokens``; ``prefix_break``: where and why the log stopped agreeing, where ``keep`` drops
    some of it (None otherwise)."""

    log: list[int]
    keep: int
    tokens: list[int]
    prefix_break: dict[str, Any] | None = None


class Chat:
    def __init__(self, ctx: HostContext) -> None:
        self.ctx = ctx

    def plan(
        self, session_id: str, messages: Sequence[Mapping[str, Any] | ChatMessage], add_generation_prompt: bool = True,
    ) -> tuple[int, list[int]]:
        keep, new, _ = self.plan_checked(session_id, messages, None, add_generation_prompt)
        return keep, new

    def plan_ahead(self, session_id: str, messages: Sequence[Mapping[str, Any] | ChatMessage]) -> ChatPlan | None:
        """The turn planned on the log of the session's last commit, read without the lock (a record
        is not changed once committed); None where there is none. ``plan_checked`` uses it where the
        session's log is still that one."""
        s = self.ctx.sessions.get(session_id)
        record = None if s is None else s.committed
        if record is None:
            return None
        try:  # a copy (one step under the GIL): the check compares it with the log as it is then
            return self.plan_on(list(record.token_log), messages)
        except Exception:  # planned again under the lock, which raises what is wrong with the messages
            return None

    def plan_checked(
        self, session_id: str, messages: Sequence[Mapping[str, Any] | ChatMessage], planned: ChatPlan | None,
        add_generation_prompt: bool = True,
    ) -> tuple[int, list[int], int]:
        """(keep, tokens, the log's length): ``planned`` where it was made on the session's log as it
        is, else planned on it now (the log read under the lock)."""
        with self.ctx.lock:
            log = self.ctx.token_log(session_id)
            if planned is not None and planned.log != log:
                planned = None
            if planned is not None and add_generation_prompt:
                self.note(session_id, planned.prefix_break)
        if planned is None:
            planned = self.plan_on(log, messages, add_generation_prompt)
            if add_generation_prompt:  # a turn's render (a reply's close does not speak for the next turn)
                self.note(session_id, planned.prefix_break)
        return planned.keep, planned.tokens, len(log)

    def plan_on(
        self, log: list[int], messages: Sequence[Mapping[str, Any] | ChatMessage], add_generation_prompt: bool = True,
    ) -> ChatPlan:
        """``plan`` for a session whose log is ``log``: reads nothing else of the host (no lock)."""
        ctx = self.ctx
        source = ctx.executor.chat_template()
        if source is None:
            raise CapabilityError(f"backend {ctx.name!r}'s model has no chat template: append text instead")
        rendered = render_conversation(source, messages, add_generation_prompt)
        executor = ctx.executor
        body = log[1:] if log and source.add_bos and log[0] == source.bos_id else log
        said = executor.detokenize(body, special=True)
        if rendered.startswith(said):
            rest = rendered[len(said):]
            return ChatPlan(log, len(log), executor.tokenize(rest, add_bos=not log and source.add_bos, special=True)
                            if rest else [])
        whole = executor.tokenize(rendered, add_bos=source.add_bos, special=True)
        agreed = 0
        for mine, theirs in zip(log, whole, strict=False):
            if mine != theirs:
                break
            agreed += 1
        end = len(log) if agreed == len(log) else self._reads_back_to(
            whole, 1 if whole and source.add_bos and whole[0] == source.bos_id else 0, said, len(log))
        if end is not None:  # the whole log holds the rendering's start, as its tokens or as their text
            return ChatPlan(log, len(log), whole[end:])
        keep, new = self._agreeing_text(log, len(log) - len(body), rendered)
        if agreed > keep:
            keep, new = agreed, whole[agreed:]
        return ChatPlan(log, keep, new, describe_break(source, messages, said, rendered, keep) if keep < len(log) else None)

    def _reads_back_to(self, whole: list[int], lead: int, said: str, guess: int) -> int | None:
        """Where the rendering's own tokens (``whole``, past a BOS: ``lead``) read back as ``said``
        (the log as text), at a token boundary: the log holds the conversation up to there in other
        tokens (a reply as the model wrote it; a tokenizer's space after a control token, which the
        raw rendering lacks but its tokens read back with), so it is kept whole and only the tokens
        after that boundary are appended. None where the rendering reads otherwise or no boundary
        of its tokens falls there. ``guess``: where the boundary likely is (the log's length: it
        holds the same text in nearly as many tokens), searched outward from there."""
        executor = self.ctx.executor
        texts: dict[int, str] = {}  # each probe's text, decoded once (the answer's is probed, then compared)

        def text_to(m: int) -> str:
            if m not in texts:
                texts[m] = executor.detokenize(whole[lead:m], special=True)
            return texts[m]

        if not said or not text_to(len(whole)).startswith(said):
            return None
        end = first_true(lead, len(whole), guess, lambda m: len(text_to(m)) >= len(said))
        return end if text_to(end) == said else None

    def _agreeing_text(self, log: list[int], start: int, rendered: str) -> tuple[int, list[int]]:
        """The longest start of the log (past its first ``start`` tokens: a BOS) that reads as a start of
        the rendering, where the rendering's rest tokenized after it reads back exactly, with that
        rest; (0, []) where none does. Generated replies often hold tokens their text does not
        tokenize back to: this keeps them where the conversation left the log later (a turn the
        client never saw, an edit of a later message)."""
        executor = self.ctx.executor
        body = log[start:]
        lo, hi, said = 0, len(body), ""  # body[:lo] reads as a start of the rendering: ``said``
        while lo < hi:
            mid = (lo + hi + 1) // 2
            text = executor.detokenize(body[:mid], special=True)
            if rendered.startswith(text):
                lo, said = mid, text
            else:
                hi = mid - 1
        if lo == 0:
            return 0, []
        rest = rendered[len(said):]
        new = executor.tokenize(rest, add_bos=False, special=True) if rest else []
        if executor.detokenize(body[:lo] + new, special=True) != rendered:
            return 0, []  # the rest tokenized on its own reads otherwise (a space prefix): compare tokens
        return start + lo, new

    def note(self, session_id: str, prefix_break: dict[str, Any] | None) -> None:
        """Where the turn's conversation left the session's log (None: nowhere), for its answer."""
        with self.ctx.lock:
            session = self.ctx.sessions.get(session_id)
            if session is not None:
                session.prefix_break = prefix_break


def first_true(lo: int, hi: int, guess: int, holds: Callable[[int], bool]) -> int:
    """The least ``m`` in ``[lo, hi]`` for which ``holds(m)``, where ``holds`` is false below some
    point and true from it on, and true at ``hi``. Searched outward from ``guess`` (steps doubling),
    then by halves: a few calls where the answer lies near the guess, against ``log2(hi - lo)``
    for halving the whole range (each call here detokenizes a whole conversation)."""
    at = min(max(guess, lo), hi)
    step = 1
    if holds(at):
        hi = at
        while hi - step >= lo:
            if not holds(hi - step):
                lo = hi - step + 1
                break
            hi -= step
            step *= 2
    else:
        lo = at + 1
        while lo + step - 1 < hi:
            if holds(lo + step - 1):
                hi = lo + step - 1
                break
            lo += step
            step *= 2
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo
