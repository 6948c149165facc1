"""One turn on a kvres session: the prompt appended (only what the session lacks), then the reply.

Primitives:
- ``Prompt``: ``messages`` (rendered with the model's chat template: ``Session.append_messages``
  appends only what the session does not hold) or ``raw`` (text or token ids, appended as they are).
- ``TurnOutcome``: the reply's ``tokens``, ``text``, ``finish_reason`` (OpenAI's: "stop" or
  "length"), ``logprobs`` and ``token_texts`` (when asked), ``top_logprobs`` (per token, the step's
  most likely tokens as ``(text, logprob)``, when asked), ``prompt_tokens`` (the context the reply
  was generated from), ``cached_tokens`` (the part of it the session already held: not prefilled
  again), ``length`` (the session's log length after the turn), ``prefix_break`` (where the
  rendered conversation first left what the session held, ``Generation.prefix_break``; None where
  it kept all of it).
- ``InContext(session, anchor, decode=None)``: the reply's text as it reads in the session (decoded
  after a token that keeps llama.cpp from dropping the first token's leading space; by ``decode``,
  the model's vocabulary in this process, else by the backend).
- ``run_turn(session, prompt, plan, anchor) -> TurnOutcome``: blocking, the whole reply at once:
  ``append_prompt(session, prompt) -> int`` (the tokens it appended), then ``reply_outcome(session,
  plan, appended, anchor, decode, seed)`` (the reply generated with ``seed``).
- ``one_call(prompt, anchor) -> bool``: whether a streamed turn is one call to the backend (then a
  stateless one runs on an ephemeral session, ``Service.stateless(one_call=True)``).
- ``StreamingTurn(service, session, stack, prompt, plan, started, anchor)`` (``start_streaming``
  makes and starts one): ``start()`` (blocking: the prompt appended and the first token pulled, so
  that an error is still an HTTP status; nothing else on that path), ``deltas()`` (an async
  iterator of text pieces, each chunk of tokens pulled on the service's threads: every token the
  backend had out, one Ray object, ``TokenStream.chunks``; the trip that finds the stream's end
  also reads how it ended), ``outcome()`` (once ``deltas()`` is done: read then), ``ttft_s``,
  ``gaps`` (the inter-token histogram), ``end()`` (blocking, once: a stream left before its end
  keeps only the tokens whose text was sent, ``sent_tokens``: what ``TextDeltas.covered`` was when
  the last piece handed to the response went out (the response asked for the next), then
  ``stack`` is closed: the session's lease released, a one-request session closed). The backend
  runs at most ``STREAM_AHEAD`` tokens past what the turn pulled, and the turn pulls a chunk only
  once the response asks for the next piece.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvres.actors.generation import Generation

from ..session_handle import Session
from .holds import retry_held
from .metrics import TOKEN_GAP_BUCKETS, Histogram
from .sampling_fields import GenerationPlan
from .service import EphemeralSession
from .text_deltas import TextDeltas

if TYPE_CHECKING:
    from ..backend_client import TokenStream
    from .service import Service


Decode = Callable[[Sequence[int]], str]


@dataclass(frozen=True)
class Prompt:
    messages: list[dict[str, Any]] | None = None
    raw: str | Sequence[int] | None = None


@dataclass
class TurnOutcome:
    tokens: list[int]
    text: str
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    length: int
    logprobs: list[float] | None = None
    token_texts: list[str] | None = field(default=None, repr=False)
    prefix_break: dict[str, Any] | None = None
    top_logprobs: list[list[tuple[str, float]]] | None = field(default=None, repr=False)

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)


def one_call(prompt: Prompt, anchor: int | None) -> bool:
    """Whether a streamed turn is one call to the backend (the prompt appended in it): where the
    model has a control token to decode the reply after, and the prompt is messages or token ids
    (text is tokenized by an append of its own)."""
    return anchor is not None and not isinstance(prompt.raw, str)


def openai_finish(kvres_finish: str) -> str:
    return "length" if kvres_finish == "length" else "stop"


def append_prompt(session: Session, prompt: Prompt) -> int:
    """How many tokens the prompt appended (what the session did not hold yet; an empty one: no call)."""
    if prompt.messages is not None:
        return session.append_messages(prompt.messages)
    assert prompt.raw is not None
    return len(session.append(prompt.raw)) if len(prompt.raw) else 0


class InContext:
    """The reply's text as it reads in the session's log: llama.cpp drops a leading space from the
    first token it decodes, so a reply decoded alone can lose the space its first token carries,
    and a conversation rendered with it would no longer be what the session holds (the next turn
    would prefill the reply again). Decoded after ``anchor`` (a control token, which reads as
    nothing, or else the prompt's last token), nothing is dropped."""

    _heads: dict[tuple[str, int], str] = {}  # (backend, anchor) -> its text, decoded once

    def __init__(self, session: Session, anchor: int, decode: Decode | None = None) -> None:
        self.session = session
        self.anchor = anchor
        self.decode: Decode = decode or session.detokenize
        key = (session.backend, anchor)
        head = self._heads.get(key)
        if head is None:
            head = self.decode([anchor])
            if len(self._heads) > 4096:
                self._heads.clear()
            self._heads[key] = head
        self.head = head

    def __call__(self, tokens: Sequence[int]) -> str:
        text = self.decode([self.anchor, *tokens])
        return text[len(self.head):] if text.startswith(self.head) else self.decode(tokens)

    def reply(self, reply: Generation) -> str:
        text = self(reply)
        if isinstance(reply.stop, str):
            cut = text.find(reply.stop)
            if cut >= 0:
                text = text[:cut]
        return text


def _in_context(session: Session, anchor: int | None, decode: Decode | None) -> InContext:
    return InContext(session, session.tokens()[-1] if anchor is None else anchor, decode)


def _token_texts(text_of: InContext, tokens: Sequence[int]) -> list[str]:
    """Each token's text as it reads after the prompt (a leading space kept)."""
    return [text_of([t]) for t in tokens]


def _top_texts(text_of: InContext, steps: Sequence[Sequence[tuple[int, float]]] | None) -> \
        list[list[tuple[str, float]]] | None:
    """Each step's most likely tokens with their texts (each token id decoded once)."""
    if steps is None:
        return None
    texts: dict[int, str] = {}
    for step in steps:
        for token, _ in step:
            if token not in texts:
                texts[token] = text_of([token])
    return [[(texts[token], lp) for token, lp in step] for step in steps]


def _length_after(session: Session, reply: Generation) -> int:
    """The session's log length after the reply: as the backend committed it, else read (a reply
    replayed for a retried call does not carry it)."""
    return reply.length if reply.length is not None else len(session.tokens())


def run_turn(session: Session, prompt: Prompt, plan: GenerationPlan, anchor: int | None,
             decode: Decode | None = None) -> TurnOutcome:
    """``anchor``: a control token of the model (``ServedModel.anchor``), or None; ``decode``: the
    model's detokenizer in this process (``ServedModel.local_decoder()``), or None (the backend's)."""
    return reply_outcome(session, plan, append_prompt(session, prompt), anchor, decode, plan.seed)


def reply_outcome(session: Session, plan: GenerationPlan, appended: int, anchor: int | None,
                  decode: Decode | None, seed: int | None) -> TurnOutcome:
    """The reply generated on a session that holds the prompt (``appended``: how many of its tokens
    the turn appended), sampled with ``seed``."""
    text_of = _in_context(session, anchor, decode)
    reply = session.generate(plan.max_tokens, plan.temperature, seed, **plan.kwargs)
    length = _length_after(session, reply)
    return _outcome(text_of, reply, text_of.reply(reply), length - len(reply), appended, plan)


def _outcome(text_of: InContext, reply: Generation, text: str, prompt_tokens: int, appended: int,
             plan: GenerationPlan) -> TurnOutcome:
    wants = plan.request.sampling.wants_logprobs
    top = getattr(reply, "top_logprobs", None) if plan.request.sampling.top_logprobs else None
    return TurnOutcome(list(reply), text, openai_finish(reply.finish_reason), prompt_tokens, prompt_tokens - appended,
                       prompt_tokens + len(reply), reply.logprobs if wants else None,
                       _token_texts(text_of, reply) if wants else None, getattr(reply, "prefix_break", None),
                       _top_texts(text_of, top))


@dataclass(eq=False)
class StreamingTurn:
    service: Service
    session: Session
    stack: contextlib.ExitStack
    prompt: Prompt
    plan: GenerationPlan
    started: float
    anchor: int | None
    decode: Decode | None = None

    def __post_init__(self) -> None:
        service, stack = self.service, self.stack
        self.text = TextDeltas(self.session.detokenize, self.plan.stop)  # replaced by start(): decoding in context
        self._in_context: InContext | None = None
        self.gaps = Histogram(TOKEN_GAP_BUCKETS)
        self.ttft_s: float | None = None
        self.appended = self.prompt_tokens = self.cached_tokens = 0
        self.sent_tokens = 0  # the tokens whose text went out to the client
        self.completed = False
        self._stream: TokenStream | None = None
        self._chunks: Iterator[list[int]] | None = None
        self._first: str | None = None
        self._final: tuple[str, int] = ("", 0)
        self._outcome: TurnOutcome | None = None  # made as the stream ends (_finish)
        self._last_token_at = 0.0
        self._pending: Future[str | None] | None = None
        self._ended = threading.Event()
        self._end_lock = threading.Lock()
        # a stream whose response was never iterated (its client gone first) still frees its session
        weakref.finalize(self, _end_unended, self._ended, stack, service.pool)

    def start(self) -> None:
        """The prompt appended and the first token pulled, in one call to the backend where the
        model has a control token to decode the reply after (else the prompt's last token is read
        between the two); the log's length is read after the reply, off the path to the first
        token. A bound session's hold is taken by that call (``holds.retry_held``: asked again for
        a moment while the request before still holds it)."""
        retry_held(self._start, self.session.session_id)

    def _start(self) -> None:
        plan, session, prompt = self.plan, self.session, self.prompt
        self._chunks = None  # (a start asked again reads its own stream)
        if self.anchor is None or isinstance(prompt.raw, str):  # not one_call: text is tokenized by the append
            self.appended = append_prompt(session, prompt)
            self._in_context = _in_context(session, None, self.decode)
            self._stream = session.stream(plan.max_tokens, plan.temperature, plan.seed, **plan.kwargs)
        else:
            self._in_context = _in_context(session, self.anchor, self.decode)
            if prompt.messages is not None:
                self._stream = session.chat_stream(prompt.messages, plan.max_tokens, plan.temperature, plan.seed,
                                                   **plan.kwargs)
            else:
                assert prompt.raw is not None
                self._stream = session.stream(plan.max_tokens, plan.temperature, plan.seed, prompt=prompt.raw,
                                              **plan.kwargs)
        self.text = TextDeltas(self._in_context, plan.stop)
        self._first = self._pull()

    def _pull(self) -> str | None:
        """The text of the next chunk of tokens (every token the backend had out: one Ray object)."""
        assert self._stream is not None
        if self._chunks is None:
            self._chunks = self._stream.chunks()
        chunk = next(self._chunks, None)
        if chunk is None:
            self._finish()  # in the same trip to the service's threads as the end of the stream
            return None
        now = time.monotonic()
        if self.ttft_s is None:
            self.ttft_s = now - self.started
        else:
            for _ in chunk:  # the chunk's tokens came over the gap since the last one
                self.gaps.observe((now - self._last_token_at) / len(chunk))
        self._last_token_at = now
        return "".join([self.text.push(token) for token in chunk])

    def _finish(self) -> None:
        assert self._in_context is not None
        reply = self.generation
        if reply.prompt_tokens is not None:
            self.appended = reply.prompt_tokens
        length = _length_after(self.session, reply)
        self.prompt_tokens = length - len(reply)
        self.cached_tokens = self.prompt_tokens - self.appended
        self._final = (self._in_context.reply(reply), length)
        self._outcome = _outcome(self._in_context, reply, self._final[0], self.prompt_tokens, self.appended,
                                 self.plan)

    async def deltas(self) -> AsyncIterator[str]:
        piece, covered = self._first, self.text.covered
        while piece is not None:
            if piece:
                yield piece
            self.sent_tokens = covered  # the response asks for more: the piece went out
            future = self._pending = self.service.pool.submit(self._pull)
            piece = await asyncio.wrap_future(future)
            covered = self.text.covered
        rest = self.text.finish(self._final[0])
        self.completed = True
        if rest:
            yield rest

    @property
    def generation(self) -> Generation:
        assert self._stream is not None and self._stream.generation is not None
        return self._stream.generation

    def outcome(self) -> TurnOutcome:
        """The turn's outcome, made as the stream ended (on the service's threads: decoding it may
        ask the backend): cheap to read once ``deltas()`` is done."""
        assert self._outcome is not None, "the stream has not ended: iterate deltas() to its end first"
        return self._outcome

    def end(self) -> None:
        with self._end_lock:
            if self._ended.is_set():
                return
            self._ended.set()
        try:
            if self._pending is not None:
                with contextlib.suppress(Exception):
                    self._pending.result()  # the token being pulled: the stream is not ours to close before
            if self._stream is not None and not self.completed:
                self._stream.close()  # commits the tokens pulled; those whose text was not sent go below
                if isinstance(self.session, EphemeralSession):
                    return  # closed by its call as it ended
                held = len(self.session.tokens())
                keep = held - self._stream.delivered + self.sent_tokens
                if held > keep:
                    self.session.truncate(keep)
        finally:
            self.stack.close()

    def end_later(self) -> None:
        """``end()`` on the service's threads (from a coroutine that may be being cancelled)."""
        if not self._ended.is_set():
            self.service.pool.submit(self.end)


def _end_unended(ended: threading.Event, stack: contextlib.ExitStack, pool: Any) -> None:
    if not ended.is_set():
        ended.set()
        with contextlib.suppress(RuntimeError):  # the pool already shut down: the replica is going
            pool.submit(stack.close)


def start_streaming(service: Service, session: Session, stack: contextlib.ExitStack, prompt: Prompt,
                    plan: GenerationPlan, started: float, anchor: int | None,
                    decode: Decode | None = None) -> StreamingTurn:
    """A started ``StreamingTurn``; on failure the stack is closed and the error raised."""
    turn = StreamingTurn(service, session, stack, prompt, plan, started, anchor, decode)
    try:
        turn.start()
    except BaseException:
        with contextlib.suppress(Exception):  # the error that stopped the start is the one to answer
            turn.end()
        raise
    return turn
