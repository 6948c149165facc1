"""The end-of-conversation audit: a session's log against what its client sent and received.

Primitives:
- ``ChatRender(model)``: the model's chat template (``kvres.actors.chat_source``), rendered as the
  backend renders it (``render_chat``): ``expected(messages, finish) -> str``.
- What "sent and received" means for a conversation of ``n`` turns: the user messages the client
  sent and the replies it received (every text delta of each turn's one answer that completed),
  in order. After its last turn the session's log, read back as text (``GET
  /v1/sessions/{id}/tokens``, the control tokens included, a leading BOS token left out), must be
  exactly the template's rendering of the first ``2n - 1`` of those messages with the generation
  prompt, followed by the last reply, followed by the model's end-of-generation token where that
  reply ended there (finish "stop"; a reply cut by ``max_tokens`` has none), and it must hold as
  many tokens as the server said the session held after that turn (prompt + completion tokens).
  A conversation given up mid-turn (``broken``: its last turn's tries failed, or were cut before
  any answer when traffic stopped) may hold what those tries left after that: its log must start
  with the rendering and hold at least as many tokens.
  Earlier replies are in the rendering as the template closes them; a turn whose session had not
  kept them would have had to prefill them again (``Attempt.rewound``). A token lost, duplicated
  or out of order changes the text or the count.
- ``audit_conversation(http, conversation, api, messages, last, render, sessions, broken,
  with_stats=False) -> AuditRow``: the session of the last turn read (a failure retried for
  ``READ_WAIT_S``; 404: the session is lost) and compared; a session that differs, or one
  ``with_stats`` (a turn of it found tokens missing), has its stats kept (whether its KV was
  recomputed exactly, its counters: the report's ``rewound_sessions``).
- ``delete_sessions(http, sessions)``: ``DELETE /v1/sessions/{id}`` for each (404 counts as done).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .http_turns import Answer

READ_WAIT_S = 300.0


class Render(Protocol):
    def expected(self, messages: list[dict[str, str]], finish: str) -> str: ...

    def log_text(self, tokens: list[int], text: str) -> str: ...


class ChatRender:
    def __init__(self, model: Path) -> None:
        from kvres.actors.chat_source import read_chat_template

        source = read_chat_template(model)
        if source is None:
            raise ValueError(f"{model} has no chat template: the soak's clients chat")
        self.source = source

    def expected(self, messages: list[dict[str, str]], finish: str) -> str:
        """``messages`` end with the last reply."""
        from kvres.actors.chat_template import render_chat

        *before, reply = messages
        closing = self.source.eos_token if finish == "stop" else ""
        return render_chat(self.source, before, add_generation_prompt=True) + reply["content"] + closing

    def log_text(self, tokens: list[int], text: str) -> str:
        """The log's text without a BOS token the tokenizer put first (the template renders none)."""
        bos = self.source.bos_token
        if self.source.add_bos and tokens and tokens[0] == self.source.bos_id and text.startswith(bos):
            return text[len(bos):]
        return text


@dataclass
class AuditRow:
    conversation: str
    api: str
    session: str | None
    turns: int
    broken: bool
    lost: bool = False  # the session was unknown (404) or could not be read
    same_text: bool = False
    expected_tokens: int = 0
    log_tokens: int = 0
    first_difference: int | None = None  # the first character where log and expectation part
    error: str = ""
    session_stats: dict[str, Any] | None = None  # a mismatched or rewound session's: exactness and counters

    @property
    def ok(self) -> bool:
        if self.turns == 0:
            return True
        if self.broken:  # given up mid-turn: what that turn's tries left may follow (same_text: a prefix)
            return not self.lost and self.same_text and self.log_tokens >= self.expected_tokens
        return not self.lost and self.same_text and self.expected_tokens == self.log_tokens


def _read(http: Any, session: str) -> tuple[int, dict[str, Any]]:
    deadline = time.monotonic() + READ_WAIT_S
    while True:
        try:
            r = http.get(f"/v1/sessions/{session}/tokens", timeout=60.0)
            if r.status_code in (200, 404) or time.monotonic() > deadline:
                return r.status_code, r.json() if r.status_code == 200 else {"error": r.text[:300]}
        except Exception as exc:
            if time.monotonic() > deadline:
                return 0, {"error": f"{type(exc).__name__}: {exc}"}
        time.sleep(1.0)


def audit_conversation(http: Any, conversation: str, api: str, messages: list[dict[str, str]], last: Answer | None,
                       render: Render, sessions: list[str], broken: bool, with_stats: bool = False) -> AuditRow:
    if last is None:  # no turn completed: nothing the client holds to compare
        return AuditRow(conversation, api, None, 0, broken)
    session = last.session_id or conversation
    row = AuditRow(conversation, api, session, len(messages) // 2, broken, expected_tokens=last.length)
    status, body = _read(http, session)
    if status != 200:
        row.lost, row.error = True, f"HTTP {status}: {body.get('error', '')}"[:300]
        return row
    tokens = [int(t) for t in body["tokens"]]
    have, want = render.log_text(tokens, str(body["text"])), render.expected(messages, last.finish)
    row.log_tokens, row.same_text = len(tokens), have.startswith(want) if broken else have == want
    if not row.same_text:
        row.first_difference = next((i for i, (a, b) in enumerate(zip(have, want, strict=False)) if a != b),
                                    min(len(have), len(want)))
        at = row.first_difference
        row.error = f"log {have[max(0, at - 40):at + 40]!r} / expected {want[max(0, at - 40):at + 40]!r}"
        row.session_stats = _stats(http, session)
    elif with_stats:  # a turn found tokens missing: what the session went through says where to look
        row.session_stats = _stats(http, session)
    return row


def _stats(http: Any, session: str) -> dict[str, Any] | None:
    try:
        r = http.get(f"/v1/sessions/{session}", timeout=60.0)
        stats = r.json() if r.status_code == 200 else {}
    except Exception:
        return None
    return {"recompute_exact": stats.get("recompute_exact"), "counters": stats.get("counters")}


def delete_sessions(http: Any, sessions: list[str], tries: int = 20) -> list[str]:
    """The sessions that could not be deleted (reported, never raised: the run goes on)."""
    left = []
    for session in sessions:
        for _ in range(tries):
            try:
                if http.delete(f"/v1/sessions/{session}", timeout=60.0).status_code in (200, 404):
                    break
            except Exception:
                pass
            time.sleep(1.0)
        else:
            left.append(session)
    return left
