"""A driver's typed client of one backend actor: one method per actor method, each one Ray call.
The operations and their parameters are those ``kvres.actors.host.backend_surface.BackendSurface``
declares (mypy checks this class against it).

Primitives:
- ``BackendClient(name, handle, revive, lease=None, routes=None)``: ``handle()`` is the actor's handle
  now (looked up again after a death: a backend created anew has a new one), ``revive()`` waits
  until the actor answers again (or raises ``BackendLostError``; ``NodeLostError`` when its node
  died; ``BackendStartError``, at once, when it could not start). ``routes`` (``failover.Failover``): a backend lost with its node hands each session's call
  to the backend the session moved to (``routed(session_id)``), and calls that name no session
  to a live backend of the same model. Calls that wait for their answer: ``open_session``,
  ``append``, ``append_text``, ``generate``, ``stream`` (a ``TokenStream``), ``chat``,
  ``append_messages``, ``cancel``, ``truncate``, ``fork``, ``tokens``, ``export``, ``restore``,
  ``suspend``, ``resume``,
  ``detach``, ``close``, ``session_stats``, ``tokenize``, ``detokenize``; ``hold(session_id, hold) ->
  tenant`` (the session taken for a request of several calls: ``holds.Hold``). Sent without waiting:
  ``release_hold``, ``renew_holds``.
- ``TokenStream``: the tokens of a streaming generate (the backend runs at most
  ``kvres.actors.host.scheduler.STREAM_AHEAD`` tokens past what it handed out), one Ray object
  per token, or per list of them read through ``chunks()``; ``generation``
  once it ended; a context manager. Leaving it early (``close()``, the end of a ``with`` block,
  dropping it, or ``end_stream``) commits only what it handed out.
- ``end_stream(session_id, only=None)``: ends this driver's unfinished stream of the session (only
  when it is ``only``, where given), committing what it handed out; ``Session`` calls it before
  its calls, so a new call is not refused as busy.
- Calls sent without waiting, returning the ``ObjectRef``: ``ping_ref``, ``stats_ref``.
- A backend whose actor runs in this process (``in_process.host_here``: a front hosted there) is
  called directly, in the caller's thread, not through Ray (``ping_ref`` and ``stats_ref`` excepted).

A call that meets the backend's death waits for it to come back and is sent once more
(``remote_calls.call``; every call that changes a session carries a request id or is safe to
repeat); errors the backend raises arrive as their kvres types, a second death as
``BackendLostError``. ``once=True`` (``resume`` of a handed-over record, ``detach``) sends a single
attempt and raises what it meets, an actor death included: the caller (a migration) decides what
that means.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ray import ObjectRef
from ray.exceptions import ActorUnschedulableError, RayActorError

from kvres.actors.config import SessionPolicy
from kvres.actors.generation import Generation, GenerationRequest
from kvres.actors.host.holds import Hold
from kvres.actors.host.journal import SessionRecord
from kvres.policy import ArgumentError, SessionExistsError, UnknownSessionError
from kvres.policy.errors import BackendLostError, NodeLostError

from .in_process import in_process_handle
from .remote_calls import answer, call

if TYPE_CHECKING:
    from kvres.actors.host.backend_surface import BackendSurface


class Routes(Protocol):
    """Where calls of a backend lost with its node go (``failover.Failover`` and the manager)."""

    def lost(self, name: str, fresh: bool = False) -> bool: ...

    def home_of(self, session_id: str, lost: str) -> str: ...

    def stand_in(self, lost: str) -> str: ...

    def client(self, name: str) -> BackendClient: ...


class BackendClient:
    def __init__(self, name: str, handle: Callable[[], Any], revive: Callable[[], None],
                 lease: ObjectRef[bytes] | None = None, routes: Routes | None = None) -> None:
        self.name = name
        self._handle = handle
        self.revive = revive
        self._lease = lease  # an object this driver owns: a backend streaming to it watches it
        self._routes = routes

    def __repr__(self) -> str:
        return f"BackendClient({self.name!r})"

    def _calls(self) -> Any:
        """Where calls go: the backend's shell itself where it runs in this process, else its actor."""
        return in_process_handle(self.name) or self._handle()

    def _call(self, submit: Callable[[Any], Any], retry_ok: tuple[type[BaseException], ...] = (),
              once: bool = False) -> Any:
        if once:
            return answer(submit(self._calls()))
        try:
            return call(lambda: submit(self._calls()), self.revive, BackendLostError, f"backend {self.name!r}",
                        retry_ok=retry_ok)
        except ActorUnschedulableError as exc:  # Ray gave up placing it: its node died, or there is no room
            self.revive()  # NodeLostError when its node died
            raise BackendLostError(f"backend {self.name!r} could not be placed ({type(exc).__name__}); check "
                                   "`kvres status` and the cluster's resources, then repeat the call") from None

    def routed(self, session_id: str) -> BackendClient:
        """The client of the backend that serves ``session_id`` now: this one, or, when this one
        was lost with its node, the one the session moved to (moved there by this call)."""
        if self._routes is None or not self._routes.lost(self.name):
            return self
        return self._routes.client(self._routes.home_of(session_id, self.name))

    def _session_call(self, session_id: str, submit: Callable[[Any], Any],
                      retry_ok: tuple[type[BaseException], ...] = ()) -> Any:
        """A call of one session: sent to the backend that serves it now; when this backend turns
        out lost with its node during the call, the session moves and the call goes there (its
        request id makes the repeat safe)."""
        client = self.routed(session_id)
        try:
            return client._call(submit, retry_ok)
        except NodeLostError:
            if client._routes is None:
                raise
            return client.routed(session_id)._call(submit, retry_ok)

    def _any_call(self, submit: Callable[[Any], Any]) -> Any:
        """A call that names no session: a lost backend's goes to a live one of the same model."""
        routes = self._routes
        client = self if routes is None or not routes.lost(self.name) else routes.client(routes.stand_in(self.name))
        try:
            return client._call(submit)
        except NodeLostError:
            if routes is None:
                raise
            return routes.client(routes.stand_in(self.name))._call(submit)

    # -- sessions -------------------------------------------------------------------------------
    def open_session(self, session_id: str, policy: SessionPolicy | None) -> None:
        """A repeat that finds the session open means the first attempt opened it."""
        if self._routes is not None and self._routes.lost(self.name):
            self.revive()  # NodeLostError naming it
        self._call(lambda h: h.open_session.remote(session_id, policy), retry_ok=(SessionExistsError,))

    def append(self, session_id: str, tokens: Sequence[int], request_id: str) -> int:
        return int(self._session_call(session_id, lambda h: h.append.remote(session_id, list(tokens), request_id)))

    def append_text(self, session_id: str, text: str, request_id: str) -> list[int]:
        return [int(t) for t in self._session_call(session_id, lambda h: h.append_text.remote(session_id, text, request_id))]

    def generate(self, session_id: str, request: GenerationRequest, request_id: str,
                 prompt: list[int] | None = None) -> Generation:
        answer_: Generation = self._session_call(
            session_id, lambda h: h.generate.remote(session_id, request, request_id, prompt))
        return answer_

    def stream(self, session_id: str, request: GenerationRequest, request_id: str, prompt: list[int] | None = None,
               messages: list[dict[str, Any]] | None = None, *, follow: Follow | None = None,
               ephemeral: bool = False, policy: SessionPolicy | None = None, hold: Hold | None = None) -> TokenStream:
        """``follow``: where the session went when this backend does not know it (its handle's
        ``_followed``): the stream starts there instead, once, before any token. ``ephemeral``: a
        stateless turn: the backend opens the session (``policy``) in the call and closes it when
        the stream ends (no journal record, no directory entry). ``hold``: the call takes the
        session for its request first, and releases it once the stream ended whole
        (``TokenStream.released``)."""
        return TokenStream(self, session_id, request, request_id, prompt, messages, follow,
                           opens=(policy,) if ephemeral else None, hold=hold)

    def stream_refs(self, session_id: str, request: GenerationRequest, request_id: str, prompt: list[int] | None = None,
                    messages: list[dict[str, Any]] | None = None, chunks: bool = False,
                    opens: tuple[SessionPolicy | None] | None = None, hold: Hold | None = None) -> Any:
        """The backend's streaming generator of one request (tokens, or with ``chunks`` lists of
        them, then the ``Generation``); ``prompt`` / ``messages``: appended first, in the same call;
        ``opens``: an ephemeral session of that policy, opened and closed by the call."""
        lease = None if self._lease is None else [self._lease]  # in a list: handed over, not resolved
        options: dict[str, Any] = {"lease": lease}
        if chunks:
            options["chunks"] = True
        if opens is not None:
            options["ephemeral"], options["policy"] = True, opens[0]
        if hold is not None:
            options["hold"] = hold
        return self._calls().stream.remote(session_id, request, request_id, prompt, messages, **options)

    def chat(self, session_id: str, messages: list[dict[str, Any]], request: GenerationRequest,
             request_id: str) -> Generation:
        answer_: Generation = self._session_call(session_id, lambda h: h.chat.remote(session_id, messages, request, request_id))
        return answer_

    def append_messages(self, session_id: str, messages: list[dict[str, Any]], request_id: str) -> int:
        return int(self._session_call(session_id, lambda h: h.append_messages.remote(session_id, messages, request_id)))

    def cancel(self, session_id: str, request_id: str, keep: int) -> Generation | None:
        answer_: Generation | None = self._session_call(session_id, lambda h: h.cancel.remote(session_id, request_id, keep))
        return answer_

    def truncate(self, session_id: str, length: int) -> int:
        return int(self._session_call(session_id, lambda h: h.truncate.remote(session_id, length)))

    def fork(self, source_id: str, new_id: str) -> None:
        """A repeat that finds the new session open means the first attempt forked it."""
        self._session_call(source_id, lambda h: h.fork.remote(source_id, new_id), retry_ok=(SessionExistsError,))

    def tokens(self, session_id: str) -> list[int]:
        return [int(t) for t in self._session_call(session_id, lambda h: h.tokens.remote(session_id))]

    def export(self, session_id: str) -> bytes:
        return bytes(self._session_call(session_id, lambda h: h.export.remote(session_id)))

    def restore(self, data: bytes, session_id: str) -> int:
        """Tokens recomputed bringing the restored session in. A repeat that finds it open means
        the first attempt restored it."""
        answer_ = self._call(lambda h: h.restore.remote(data, session_id), retry_ok=(SessionExistsError,))
        return 0 if answer_ is None else int(answer_[1])

    def suspend(self, session_id: str) -> None:
        self._session_call(session_id, lambda h: h.suspend.remote(session_id))

    def resume(self, session_id: str, record: SessionRecord | None = None, *, once: bool = False,
               retry_ok: tuple[type[BaseException], ...] = ()) -> int:
        """Tokens recomputed. With ``record`` (handed over by another backend) the session comes
        from it instead of this backend's own record (and is sent here, never routed)."""
        if record is not None:
            return int(self._call(lambda h: h.resume.remote(session_id, record), retry_ok=retry_ok, once=once) or 0)
        return int(self._session_call(session_id, lambda h: h.resume.remote(session_id, None)) or 0)

    def detach(self, session_id: str, *, once: bool = False) -> SessionRecord:
        """The session's record, taken off this backend (served by none until it is resumed)."""
        record: SessionRecord = self._call(lambda h: h.detach.remote(session_id), once=once)
        return record

    def close(self, session_id: str) -> None:
        """A repeat that finds the session gone means the first attempt closed it."""
        self._session_call(session_id, lambda h: h.close.remote(session_id), retry_ok=(UnknownSessionError,))

    def pause_for_tools(self, session_id: str) -> None:
        self._session_call(session_id, lambda h: h.pause_for_tools.remote(session_id))

    def session_stats(self, session_id: str) -> dict[str, Any]:
        return dict(self._session_call(session_id, lambda h: h.session_stats.remote(session_id)))

    def hold(self, session_id: str, hold: Hold) -> str | None:
        """The session taken for ``hold.holder``'s request (``SessionHeldError`` where another holds
        it); its tenant."""
        tenant: str | None = self._session_call(session_id, lambda h: h.hold.remote(session_id, hold))
        return tenant

    def release_hold(self, session_id: str, holder: str) -> None:
        self._calls().release_hold.remote(session_id, holder)

    def renew_holds(self, held: dict[str, str], ttl_s: float) -> None:
        self._calls().renew_holds.remote(held, ttl_s)

    # -- the backend ----------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        return [int(t) for t in self._any_call(lambda h: h.tokenize.remote(text, add_bos, special))]

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        return str(self._any_call(lambda h: h.detokenize.remote(list(tokens), special)))

    def ping_ref(self) -> ObjectRef[str]:
        """The node id the backend runs on, once it has started (its constructor has run)."""
        ref: ObjectRef[str] = self._handle().ping.remote()
        return ref

    def stats_ref(self) -> ObjectRef[dict[str, Any]]:
        ref: ObjectRef[dict[str, Any]] = self._handle().stats.remote()
        return ref


Follow = Callable[[], "BackendClient | None"]


@dataclass
class _StreamState:
    """What a stream's generator and its handle share (the generator holds this, not the handle,
    so dropping the handle closes the generator at once)."""

    client: BackendClient
    session_id: str
    request: GenerationRequest
    request_id: str
    prompt: list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    generation: Generation | None = None
    delivered: int = 0
    follow: Follow | None = None
    sent: bool = False  # the backend was asked (at the first next())
    left: bool = False  # its caller left it: nothing more is handed out
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    handed: list[int] = field(default_factory=list)  # the tokens handed out, that a repeat must give again
    opens: tuple[SessionPolicy | None] | None = None  # an ephemeral session the call opens (of this policy)
    hold: Hold | None = None  # the request's hold the call takes (released by the backend at a whole end)
    released: bool = False  # the stream ended whole (not left) on the backend, which released ``hold`` then


# this driver's latest stream of each session, while something holds it
_streams: weakref.WeakValueDictionary[str, TokenStream] = weakref.WeakValueDictionary()
_streams_lock = threading.Lock()


def end_stream(session_id: str, only: TokenStream | None = None) -> None:
    """End this driver's unfinished stream of ``session_id`` (only where it is ``only``), committing
    the tokens it handed out; a stream that ended already is left as it is."""
    with _streams_lock:
        stream = _streams.get(session_id)
        if stream is None or (only is not None and stream is not only):
            return
        del _streams[session_id]
    stream.close()


class TokenStream:
    """Tokens as the backend produces them (a Ray streaming generator), at most ``STREAM_AHEAD``
    ahead of what it handed out (the backend waits for its reader); ``generation`` (why it ended)
    once it has. Iterated, it hands out one token per Ray object; ``chunks()`` hands out lists
    instead, each every token the backend had out when the last list was taken, one Ray object
    each (read one way or the other). Leaving it early (``close()``, a ``with`` block's end,
    dropping it, or the next call of the session through its handle: ``end_stream``) ends the call
    on the backend with only the tokens handed out committed. After a backend death the request is
    sent again once the backend is back: the same sampler and seed give the same tokens, and those
    already handed out are skipped; where the repeat gives other ones (the session's KV recomputed
    inexactly) the stream ends with ``BackendLostError`` (``_diverged``)."""

    def __init__(self, client: BackendClient, session_id: str, request: GenerationRequest, request_id: str,
                 prompt: list[int] | None = None, messages: list[dict[str, Any]] | None = None,
                 follow: Follow | None = None, opens: tuple[SessionPolicy | None] | None = None,
                 hold: Hold | None = None) -> None:
        self._state = _StreamState(client, session_id, request, request_id, prompt, messages, follow=follow,
                                   opens=opens, hold=hold)
        self._tokens: Generator[int, None, None] | None = None
        self._chunks: Generator[list[int], None, None] | None = None
        with _streams_lock:
            _streams[session_id] = self

    def __iter__(self) -> TokenStream:
        return self

    def __next__(self) -> int:
        if self._tokens is None:
            if self._chunks is not None:
                raise ArgumentError("this stream is read in chunks (chunks()); read it on that way")
            self._tokens = _tokens_of(_run(self._state, chunks=False))
        return next(self._tokens)

    def chunks(self) -> Iterator[list[int]]:
        """The tokens in lists, one Ray object each: the first token alone, then every token the
        backend had out once it had ``CHUNK_TOKENS`` (or its last) since the last list was taken
        (it runs at most ``STREAM_AHEAD`` tokens past what was handed out). A list handed out
        counts whole in what the stream handed out."""
        if self._chunks is None:
            if self._tokens is not None:
                raise ArgumentError("this stream is read token by token; read it on that way")
            self._chunks = _run(self._state, chunks=True)
        return self._chunks

    def __enter__(self) -> TokenStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def generation(self) -> Generation | None:
        return self._state.generation

    @property
    def delivered(self) -> int:
        return self._state.delivered

    @property
    def released(self) -> bool:
        """The stream ended whole on the backend (its ``Generation`` came with it): a ``hold`` it
        carried was released there."""
        return self._state.released

    @property
    def finish_reason(self) -> str | None:
        return None if self._state.generation is None else self._state.generation.finish_reason

    def close(self) -> None:
        """Leave the stream: the backend keeps (commits) only the tokens handed out so far. From
        another thread than the one reading it, that reader gets no more tokens."""
        _leave(self._state)
        for reader in (self._tokens, self._chunks):
            if reader is not None:
                with contextlib.suppress(ValueError):  # being read in another thread: it stops at its next token
                    reader.close()


def _tokens_of(chunks: Generator[list[int], None, None]) -> Generator[int, None, None]:
    """One token per list (a stream read token by token gets one token per Ray object)."""
    try:
        for chunk in chunks:
            yield chunk[0]
    finally:
        chunks.close()


def _run(state: _StreamState, chunks: bool) -> Generator[list[int], None, None]:
    client = state.client = state.client.routed(state.session_id)
    attempt, followed = 1, False
    try:
        while True:
            produced = 0
            try:
                with state.lock:
                    if state.left:
                        return
                    state.sent = True
                for ref in client.stream_refs(state.session_id, state.request, state.request_id, state.prompt,
                                               state.messages, chunks=chunks, opens=state.opens, hold=state.hold):
                    item = answer(ref)
                    if isinstance(item, Generation):
                        state.generation = item
                        state.released = item.finish_reason != "cancelled"  # as the backend decides
                        continue
                    got = [int(t) for t in item] if isinstance(item, list) else [int(item)]
                    new: list[int] = []
                    for token in got:
                        produced += 1
                        if produced > state.delivered:
                            new.append(token)
                        elif token != state.handed[produced - 1]:
                            _diverged(state, client.name, produced - 1)
                    if not new:
                        continue
                    with state.lock:
                        left, kept = state.left, state.delivered
                        if not left:
                            state.delivered += len(new)
                            state.handed.extend(new)
                    if left:  # by another thread; where the backend did not have the call yet, now it has
                        if state.generation is None:
                            _cancel(state, kept)
                        return
                    yield new
                return
            except UnknownSessionError:
                moved = None if followed or state.delivered or state.follow is None else state.follow()
                if moved is None:
                    raise
                followed, client = True, moved  # another handle migrated the session: it starts there
                state.client = client
            except (RayActorError, ActorUnschedulableError) as exc:
                if attempt == 2:
                    raise BackendLostError(
                        f"backend {client.name!r} died twice during one stream ({type(exc).__name__}); "
                        f"{state.delivered} tokens were handed out and not committed: repeat the call"
                    ) from None
                attempt += 1
                try:
                    client.revive()
                except NodeLostError:  # lost with its node: the session moves, the stream goes on there
                    client = state.client = client.routed(state.session_id)
    finally:
        if state.generation is None:
            _leave(state)


def _diverged(state: _StreamState, backend: str, agreed: int) -> None:
    """The repeat after a backend's death gives other tokens than those handed out (the session's
    KV was recomputed from its log inexactly, after an eviction): the stream ends here, its call
    keeping (``_leave``) the tokens handed out that the repeat gave too, so the log never holds a
    token its reader was not given."""
    handed = state.delivered
    state.delivered = agreed
    raise BackendLostError(
        f"backend {backend!r} died during a stream of session {state.session_id!r} and its repeat diverged from "
        f"the {handed} tokens handed out at token {agreed} (the session's KV was recomputed inexactly); the log "
        f"keeps the {agreed} tokens before it: read it (tokens()) and go on from there")


def _leave(state: _StreamState) -> None:
    """The call ends on the backend with the tokens handed out committed (once; nothing to do for
    a stream that ended, or that never asked the backend)."""
    with state.lock:
        if state.left or state.generation is not None:
            return
        state.left = True
        if not state.sent:
            return
        keep = state.delivered
    _cancel(state, keep)


def _cancel(state: _StreamState, keep: int) -> None:
    try:
        generation = state.client.cancel(state.session_id, state.request_id, keep)
        if state.generation is None:  # (the reader of another thread may have had it from the backend)
            state.generation = generation
    except Exception as exc:  # the stream was left: its caller has nothing to receive an error
        if isinstance(exc, UnknownSessionError) and state.opens is not None:
            return  # an ephemeral session is closed by its call as it ends
        logging.getLogger("kvres.cluster").warning(
            "session %r: leaving a stream after %d tokens failed (%s: %s)", state.session_id, keep,
            type(exc).__name__, exc)


if TYPE_CHECKING:
    def _declared(client: BackendClient) -> BackendSurface[TokenStream, int]:
        return client  # mypy checks the client's operations against their declaration
