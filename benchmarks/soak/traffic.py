"""The soak's traffic: HTTP chat clients, each taking its conversations' turns one after another.

Primitives:
- ``TrafficShape(clients=16, conversations_per_client=2, responses_clients=8, turns=8,
  user_words=12, reply_tokens=24, seed=0)``: who sends what. Clients ``0 ..
  clients - responses_clients - 1`` hold chat conversations bound to a session
  (``X-Session-Id``), the others Responses chains (``previous_response_id``); each client keeps
  ``conversations_per_client`` conversations going at once, a turn of each in turn, so there are
  more sessions than the backend's slots. A conversation ends after ``turns`` turns: it is
  audited (``audit.py``), its sessions deleted, and a fresh one takes its place.
- ``Attempt``: one request of a turn as its client saw it (seconds on the run's clock): its
  ``outcome`` ("ok", "failed", "refused", "unreachable"), ``retry`` (0: the turn's first try; 1:
  the retry after a failure; more: a retry that failed was retried again), the tokens the server
  counted, ``rewound``: tokens of the session's log before the turn that the turn did not find
  (its ``cached_tokens`` fell short of the log's length after the conversation's last turn);
  ``rerendered``: the same where the server said the rendered conversation left what the session
  held (``kvres.prefix_break``: a reply whose text tokenizes otherwise than the model wrote it),
  a cache miss that loses nothing.
- The client's retry rule: a refusal (429, or 409 while another request holds the session) and an
  unreachable server are not failures: the same request goes again after a short wait. A
  connection cut before any answer may have reached a server that died before it answered (the
  direct front is proxy and replica in one process; the local front is the backend's process too): once traffic stops such a turn is sent
  again within the drain like a retry, and where it cannot complete, its conversation is given
  up (``unfinished``) rather than audited as if the try never ran. A turn
  that failed after the server took it is sent again once the API answers (``/health``) and
  ``RETRY_BACKOFF_S`` more passed, once: the same messages on the same ``X-Session-Id`` (the
  session keeps what it holds of them and drops what the failed try left beyond them), or the
  same input with the same
  ``previous_response_id`` (the HTTP API has no request id; these make a resend idempotent). A
  retry that fails again is a violation the report names; the client tries up to ``MAX_TRIES``
  times, then gives the conversation up (``broken``).
- ``Traffic(base_url, model_id, shape, render)``: ``start()``, ``stop(drain_s)`` (each client
  finishes its turn under way, retries included, within ``drain_s``, then every open
  conversation is audited), ``attempts``, ``audits``, ``clock()`` (seconds since start),
  ``first_ok_after(t)`` (the earliest end of a request sent at or after ``t`` that completed).
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.chat_fleet.workload import words

from .audit import AuditRow, Render, audit_conversation, delete_sessions
from .http_turns import Answer, Refused, TurnFailed, Unreachable, chat_turn, responses_turn

MAX_TRIES = 5
REFUSED_WAIT_S = 0.5
RETRY_BACKOFF_S = 1.0
HEALTH_WAIT_S = 300.0


@dataclass(frozen=True)
class TrafficShape:
    clients: int = 16
    conversations_per_client: int = 2
    responses_clients: int = 8
    turns: int = 8
    user_words: int = 12
    reply_tokens: int = 24
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.clients, self.conversations_per_client, self.turns, self.user_words, self.reply_tokens) < 1:
            raise ValueError(f"every size of the soak's traffic must be >= 1: {self}")
        if not 0 <= self.responses_clients <= self.clients:
            raise ValueError(f"responses_clients must be in 0..clients ({self.clients}), got {self.responses_clients}")

    def api_of(self, client: int) -> str:
        return "responses" if client >= self.clients - self.responses_clients else "chat"

    @property
    def sessions(self) -> int:
        return self.clients * self.conversations_per_client


@dataclass
class Attempt:
    client: int
    conversation: str
    api: str
    turn: int
    retry: int
    start: float
    end: float
    outcome: str  # ok | failed | refused | unreachable
    first_token: float | None = None
    error: str = ""
    status: int | None = None
    code: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    rewound: int = 0
    rerendered: int = 0  # the same, where the server said the rendering left the log (``prefix_break``)

    @property
    def latency(self) -> float:
        return self.end - self.start

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start


@dataclass
class Conversation:
    id: str
    api: str
    client: int
    messages: list[dict[str, str]] = field(default_factory=list)  # user and assistant, as sent and received
    turns: int = 0  # completed
    last: Answer | None = None
    sessions: list[str] = field(default_factory=list)  # every session it ran on (a chain may branch)
    broken: bool = False
    rewound: bool = False  # a turn found tokens of an earlier answered one missing


class Traffic:
    def __init__(self, base_url: str, model_id: str, shape: TrafficShape, render: Render) -> None:
        self.base_url, self.model_id, self.shape, self.render = base_url, model_id, shape, render
        self.attempts: list[Attempt] = []
        self.audits: list[AuditRow] = []
        self.unfinished: list[str] = []  # conversations whose turn was still being retried at the drain's end
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._drain_until = float("inf")
        self._threads: list[threading.Thread] = []
        self._t0 = time.monotonic()
        self._run_id = uuid.uuid4().hex[:6]

    def clock(self, at: float | None = None) -> float:
        return (time.monotonic() if at is None else at) - self._t0

    def start(self) -> Traffic:
        self._t0 = time.monotonic()
        self._threads = [threading.Thread(target=self._client, args=(c,), name=f"soak-client-{c}", daemon=True)
                         for c in range(self.shape.clients)]
        for t in self._threads:
            t.start()
        return self

    def stop(self, drain_s: float = 300.0) -> None:
        self._drain_until = time.monotonic() + drain_s
        self._stop.set()
        for t in self._threads:
            t.join(timeout=max(1.0, self._drain_until - time.monotonic()) + 600.0)

    def first_ok_after(self, t: float) -> float | None:
        with self._lock:
            ends = [a.end for a in self.attempts if a.outcome == "ok" and a.start >= t]
        return min(ends) if ends else None

    # -- a client ------------------------------------------------------------------------------------
    def _new(self, client: int, k: int) -> Conversation:
        api = self.shape.api_of(client)
        cid = f"soak-{self._run_id}-{client}-{k}"
        return Conversation(cid, api, client, sessions=[cid] if api == "chat" else [])

    def _client(self, client: int) -> None:
        import httpx

        rng = np.random.default_rng((self.shape.seed, client))
        made = 0
        slots: list[Conversation] = []
        for _ in range(self.shape.conversations_per_client):
            slots.append(self._new(client, made))
            made += 1
        with httpx.Client(base_url=self.base_url, timeout=HEALTH_WAIT_S) as http:
            k = 0
            while not self._stop.is_set():
                i = k % len(slots)
                k += 1
                conv = slots[i]
                user = words(rng, self.shape.user_words, lambda text: len(text.split()))
                self._turn(http, conv, user)
                if conv.broken or conv.turns >= self.shape.turns:
                    self._finish(http, conv)
                    slots[i] = self._new(client, made)
                    made += 1
            for conv in slots:
                self._finish(http, conv)

    def _finish(self, http: Any, conv: Conversation) -> None:
        row = audit_conversation(http, conv.id, conv.api, conv.messages, conv.last, self.render,
                                 conv.sessions, conv.broken, with_stats=conv.rewound)
        delete_sessions(http, conv.sessions)
        with self._lock:
            self.audits.append(row)

    def _send(self, http: Any, conv: Conversation, user: str) -> Answer:
        if conv.api == "chat":
            return chat_turn(http, self.model_id, [*conv.messages, {"role": "user", "content": user}], conv.id,
                             self.shape.reply_tokens)
        previous = conv.last.response_id if conv.last is not None else None
        return responses_turn(http, self.model_id, user, previous, self.shape.reply_tokens)

    def _turn(self, http: Any, conv: Conversation, user: str) -> None:
        retry = 0
        sent = False  # a try may have reached the server (a connection cut before any answer)
        while True:
            if self._stop.is_set() and ((retry == 0 and not sent) or time.monotonic() > self._drain_until):
                if retry or sent:
                    with self._lock:
                        self.unfinished.append(conv.id)
                    conv.broken = True
                return
            start = time.monotonic()
            attempt = Attempt(conv.client, conv.id, conv.api, conv.turns, retry, self.clock(start), 0.0, "ok")
            try:
                answer = self._send(http, conv, user)
            except (Refused, Unreachable, TurnFailed) as exc:
                attempt.end = self.clock()
                attempt.error, attempt.status, attempt.code = str(exc)[:300], exc.status, exc.code
                attempt.outcome = ("refused" if isinstance(exc, Refused)
                                   else "unreachable" if isinstance(exc, Unreachable) else "failed")
                with self._lock:
                    self.attempts.append(attempt)
                sent |= isinstance(exc, Unreachable) and exc.maybe_taken
                if isinstance(exc, TurnFailed):
                    retry += 1
                    if retry >= MAX_TRIES:
                        conv.broken = True
                        return
                    self._wait_healthy(http)
                    time.sleep(RETRY_BACKOFF_S)
                else:
                    time.sleep(REFUSED_WAIT_S)
                continue
            attempt.end = self.clock()
            attempt.first_token = None if answer.first_token_at is None else self.clock(answer.first_token_at)
            attempt.prompt_tokens, attempt.cached_tokens = answer.prompt_tokens, answer.cached_tokens
            attempt.completion_tokens = answer.completion_tokens
            if conv.last is not None:
                short = max(0, conv.last.length - answer.cached_tokens)
                if answer.prefix_break is None:
                    attempt.rewound = short
                    conv.rewound = conv.rewound or short > 0
                else:  # the log held those tokens, tokenized otherwise than the reply's text renders: no loss
                    attempt.rerendered = short
            with self._lock:
                self.attempts.append(attempt)
            conv.messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer.text}]
            conv.last = answer
            conv.turns += 1
            if answer.session_id and answer.session_id not in conv.sessions:
                conv.sessions.append(answer.session_id)
            return

    def _wait_healthy(self, http: Any) -> None:
        deadline = time.monotonic() + HEALTH_WAIT_S
        while time.monotonic() < deadline:
            try:
                if http.get("/health", timeout=10.0).status_code == 200:
                    return
            except Exception:
                pass
            time.sleep(0.5)
