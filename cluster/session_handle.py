"""A session as a driver holds it: one Ray call per operation on the backend that serves it.

Primitives:
- ``Session(manager, session_id, backend)``: ``append(tokens or text)``, ``generate`` and
  ``stream`` (stop at the model's end-of-generation tokens, stop ids and strings, ``max_tokens``;
  llama.cpp's sampler chain), ``chat(messages)``, ``chat_stream`` and ``append_messages`` (the model's chat
  template; only what the session does not hold is appended), ``tokens()``, ``text()``,
  ``truncate(n)``, ``rollback(k)``, ``fork(new_id)``, ``export(path)``, ``suspend``, ``resume``,
  ``migrate(backend)``, ``stats()``, ``detokenize``, ``close()``; a context manager that closes it.

The operations are those ``kvres.cluster.session_surface.SessionSurface`` declares (mypy checks
``Session`` against it; ``SESSION_FORWARDS`` there names the backend operations each one reaches).
Calls go through the backend's typed client (``BackendClient``); errors raised by the actors
arrive as their kvres types. Each call carries a request id, so a call repeated after a backend
died is never applied twice. A handle follows its session when another handle (of this driver or
another) migrated it: a call its old backend does not know goes where the planner's directory says.

Streams end where the caller leaves them: a handle's next call on its session (``detokenize``, the
model's, aside) first ends the stream it left unfinished (``break`` with the stream still held),
committing exactly the tokens it handed out; a call that changes the session does so for this
driver's unfinished stream of it whichever handle made it (reads through another handle,
``tokens``, ``text``, ``stats``, leave it running). So a new call is not refused with
``SessionBusyError`` because of a stream this driver left.
"""

from __future__ import annotations

import os
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from kvres.actors.chat_template import messages_of
from kvres.actors.config import SessionPolicy
from kvres.actors.generation import Generation, GenerationRequest
from kvres.actors.sampling import SamplingParams
from kvres.policy import ArgumentError, KvresError, RangeError, UnknownSessionError
from kvres.policy.tokens import token_ids

from .backend_client import BackendClient, TokenStream, end_stream
from .planner_client import PlannerClient
from .session_files import export_target, write_session_file

if TYPE_CHECKING:
    from .session_surface import SessionSurface

T = TypeVar("T")


class SessionManager(Protocol):
    """What a session needs of its manager (``kvres.cluster.session.SessionManager``)."""

    def backend(self, name: str) -> BackendClient: ...

    @property
    def planner_client(self) -> PlannerClient: ...

    def migrate(self, session: Session, backend: str) -> None: ...

    def fork(self, session: Session, new_id: str | None) -> Session: ...


class Session:
    # an ephemeral session (the HTTP front's stateless turn): (its policy,) where its one stream
    # opens it on the backend and closes it as it ends; None for a session opened on its own
    _opens: tuple[SessionPolicy | None] | None = None

    def __init__(self, manager: SessionManager, session_id: str, backend: str) -> None:
        self._manager = manager
        self.session_id = session_id
        self.backend = backend
        self._stream: weakref.ref[TokenStream] | None = None  # the last stream made through this handle

    def __repr__(self) -> str:
        return f"Session({self.session_id!r} on {self.backend!r})"

    @property
    def _backend(self) -> BackendClient:
        """The client of the backend serving the session now (where it moved, when its backend
        was lost with its node: ``backend`` follows it)."""
        client = self._manager.backend(self.backend).routed(self.session_id)
        self.backend = client.name
        return client

    def _end_stream(self, changes: bool = True) -> None:
        """Before a call: end the stream this handle left unfinished, and, for a call that
        ``changes`` the session, this driver's unfinished stream of it from any handle."""
        if changes:
            end_stream(self.session_id)
            return
        mine = None if self._stream is None else self._stream()
        if mine is not None:
            end_stream(self.session_id, only=mine)

    def _call(self, op: Callable[[], T], changes: bool = True) -> T:
        """``op`` on the backend serving the session, once the streams it ends have ended
        (``changes``: False for a read). Where that backend does not know the session and the
        planner's directory says it lives elsewhere now (another handle migrated it), the handle
        follows it and ``op`` runs there once more (the first backend applied nothing)."""
        self._end_stream(changes)
        try:
            return op()
        except UnknownSessionError:
            if self._followed() is None:
                raise
            return op()

    def _followed(self) -> BackendClient | None:
        """The client of the backend the session moved to, the handle now pointing there; None
        where it did not move."""
        try:
            now = self._manager.planner_client.where(self.session_id)
        except KvresError:  # the planner is away: the backend's answer stands
            return None
        if now is None or now == self.backend:
            return None
        self.backend = now
        return self._backend

    def append(self, tokens_or_text: str | Sequence[int]) -> list[int]:
        """Append token ids, or text (tokenized by the backend's model); returns the token ids.
        All of them are committed or none; if the backend dies during the call it is repeated
        once it is back, and never applied twice."""
        request = uuid.uuid4().hex
        if isinstance(tokens_or_text, bytes):
            raise ArgumentError(f"append takes text (str) or token ids, got bytes {tokens_or_text[:40]!r}")
        if isinstance(tokens_or_text, str):
            text = tokens_or_text
            return self._call(lambda: self._backend.append_text(self.session_id, text, request))
        tokens = token_ids(tokens_or_text)
        self._call(lambda: self._backend.append(self.session_id, tokens, request))
        return tokens

    def generate(self, max_tokens: int, temperature: float = 0.0, seed: int | None = None, *,
                 stop: str | Sequence[str] = (), stop_token_ids: Sequence[int] = (), ignore_eos: bool = False,
                 prompt: Sequence[int] | None = None, **sampling: Any) -> Generation:
        """Generate until the model's end-of-generation token, a stop id or string, or
        ``max_tokens``; committed together (like an append). ``prompt``: token ids appended first,
        in the same call and commit (``prompt_tokens`` counts them). ``sampling``: the other fields
        of ``SamplingParams`` (top_k, top_p, min_p, repeat_penalty, frequency_penalty,
        presence_penalty, penalty_last_n, grammar, json_schema, logprobs, top_logprobs,
        logit_bias). Returns a ``Generation``: the token ids, with ``finish_reason``, ``text``,
        ``logprobs`` and ``top_logprobs``."""
        request = _request(max_tokens, temperature, seed, stop, stop_token_ids, ignore_eos, sampling)
        request_id, given = uuid.uuid4().hex, _prompt(prompt)
        return self._call(lambda: self._backend.generate(self.session_id, request, request_id, given))

    def stream(self, max_tokens: int, temperature: float = 0.0, seed: int | None = None, *,
               stop: str | Sequence[str] = (), stop_token_ids: Sequence[int] = (), ignore_eos: bool = False,
               prompt: Sequence[int] | None = None, **sampling: Any) -> TokenStream:
        """Tokens as they are produced (a Ray streaming generator underneath), under the same
        rules as ``generate`` (``prompt``: token ids appended first, in the same call: the first
        token comes right after they are in). The backend produces at most ``STREAM_AHEAD`` (8)
        tokens past what the stream handed out, and commits the call once all were handed out.
        The stream ends where its caller leaves it, committing only the tokens it handed out (left
        before the prompt was in: nothing, the prompt neither): ``break`` and this handle's next
        call on the session (the stream still held), ``close()``, the end of a ``with`` block,
        dropping it, a call that changes the session through another handle of this driver, the
        driver's death; ``finish_reason`` ("cancelled") and ``generation`` say how it ended. If
        the backend dies midway the stream goes on from the same request once it is back."""
        request = _request(max_tokens, temperature, seed, stop, stop_token_ids, ignore_eos, sampling)
        given = _prompt(prompt)
        self._end_stream()
        return self._made(self._backend.stream(self.session_id, request, uuid.uuid4().hex, given,
                                               follow=self._followed, **self._opening()))

    def _opening(self) -> dict[str, Any]:
        return {} if self._opens is None else {"ephemeral": True, "policy": self._opens[0]}

    def _made(self, stream: TokenStream) -> TokenStream:
        self._stream = weakref.ref(stream)
        return stream

    def chat_stream(self, messages: Sequence[Mapping[str, Any]], max_tokens: int = 256, temperature: float = 0.0,
                    seed: int | None = None, *, stop: str | Sequence[str] = (), stop_token_ids: Sequence[int] = (),
                    ignore_eos: bool = False, **sampling: Any) -> TokenStream:
        """``chat`` as a stream, in one call: what the session lacks of the conversation is
        appended and the reply's tokens come as they are produced (the first right after the new
        turn is in); ``generation.prompt_tokens`` counts what was appended. It ends where its
        caller leaves it, as ``stream`` does."""
        request = _request(max_tokens, temperature, seed, stop, stop_token_ids, ignore_eos, sampling)
        checked = [m.model_dump() for m in messages_of(messages)]
        self._end_stream()
        return self._made(self._backend.stream(self.session_id, request, uuid.uuid4().hex, messages=checked,
                                               follow=self._followed, **self._opening()))

    def chat(self, messages: Sequence[Mapping[str, Any]], max_tokens: int = 256, temperature: float = 0.0,
             seed: int | None = None, *, stop: str | Sequence[str] = (), stop_token_ids: Sequence[int] = (),
             ignore_eos: bool = False, **sampling: Any) -> Generation:
        """One chat turn: ``messages`` (the whole conversation so far, the new user turn last)
        rendered with the model's own chat template; only what the session does not hold yet is
        appended (``prompt_tokens`` of the answer counts it), then the reply is generated until the
        model ends it. ``text`` is the reply, to add to ``messages`` as
        ``{"role": "assistant", "content": reply.text}`` for the next turn."""
        request = _request(max_tokens, temperature, seed, stop, stop_token_ids, ignore_eos, sampling)
        checked, request_id = [m.model_dump() for m in messages_of(messages)], uuid.uuid4().hex
        return self._call(lambda: self._backend.chat(self.session_id, checked, request, request_id))

    def append_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """Render ``messages`` with the model's chat template (with the generation prompt) and
        append what the session does not hold yet; returns how many tokens that was."""
        checked, request_id = [m.model_dump() for m in messages_of(messages)], uuid.uuid4().hex
        return self._call(lambda: self._backend.append_messages(self.session_id, checked, request_id))

    def tokens(self) -> list[int]:
        """The session's token log (the source of truth): everything appended and generated."""
        return self._call(lambda: self._backend.tokens(self.session_id), changes=False)

    def text(self) -> str:
        """The token log as text (the model's control tokens included)."""
        return self._backend.detokenize(self.tokens(), special=True)

    def truncate(self, length: int) -> int:
        """Keep the first ``length`` tokens of the log; the rest leave the log and the KV
        (resident, parked or spilled) as if they had never been appended. Returns the length."""
        return self._call(lambda: self._backend.truncate(self.session_id, length))

    def rollback(self, count: int) -> int:
        """Drop the last ``count`` tokens (``truncate``); returns the log's new length."""
        if isinstance(count, bool) or not isinstance(count, int):
            raise ArgumentError(f"count must be an int >= 0, got {type(count).__name__} {count!r}")
        held = len(self.tokens())
        if not 0 <= count <= held:
            raise RangeError(f"cannot roll back {count} tokens: session {self.session_id!r} holds {held}")
        return self.truncate(held - count)

    def fork(self, new_id: str | None = None) -> Session:
        """A new session on the same backend that starts from this one's state (its KV shared
        or copied by the engine) and continues independently."""
        return self._call(lambda: self._manager.fork(self, new_id))

    def export(self, path: str | os.PathLike[str]) -> Path:
        """Write the session (its log, policy, last logits and KV) to ``path``, authenticated with
        the cluster's block secret; ``SessionManager.restore(path)`` loads it on any backend of the
        same model of this cluster. The session runs on. Returns the path written. A path that names
        no file that can be written (empty, ``.``, a directory, in a folder that does not exist or
        cannot be written) raises ``SessionFileError`` naming it, and writes nothing."""
        target = export_target(path)  # refused before the backend is asked for anything
        data = self._call(lambda: self._backend.export(self.session_id))
        write_session_file(target, data)
        return target

    def suspend(self) -> None:
        self._call(lambda: self._backend.suspend(self.session_id))

    def pause_for_tools(self) -> None:
        """Its last turn ended in tool calls whose results are on their way: the backend parks it
        after its idle sessions until its next call (within its policy's ``tool_pause_s``) and, if it
        had to be parked, brings it back ahead of that call once a slot and room are free."""
        self._call(lambda: self._backend.pause_for_tools(self.session_id), changes=False)

    def resume(self) -> int:
        """Bring the session back; returns how many tokens had to be recomputed."""
        return self._call(lambda: self._backend.resume(self.session_id))

    def migrate(self, backend: str) -> None:
        """Move to another backend (on another node where there is one); KV travels through the
        cold store, nothing is lost if the target refuses it."""
        self._call(lambda: self._manager.migrate(self, backend))

    def stats(self) -> dict[str, Any]:
        return self._call(lambda: self._backend.session_stats(self.session_id), changes=False)

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        """Token ids as text (``special``: the model's control tokens as their text too); ids
        outside the model's vocabulary are refused (``TokenIdError``)."""
        if not isinstance(special, bool):
            raise ArgumentError(f"special must be a bool, got {type(special).__name__} {special!r}")
        return self._backend.detokenize(token_ids(tokens), special)

    def close(self) -> None:
        self._call(lambda: self._backend.close(self.session_id))
        self._manager.planner_client.forget(self.session_id)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _request(max_tokens: int, temperature: float, seed: int | None, stop: str | Sequence[str],
             stop_token_ids: Sequence[int], ignore_eos: bool, sampling: dict[str, Any]) -> GenerationRequest:
    """The request, validated here (a ``ValidationError`` naming the field) before any Ray call."""
    params = SamplingParams(temperature=temperature, seed=seed, **sampling)
    if params.seed is None and params.temperature > 0:
        params = params.model_copy(update={"seed": _seed_for(params.temperature, None)})
    return GenerationRequest(max_tokens=max_tokens, sampling=params, stop=stop,  # type: ignore[arg-type]
                             stop_token_ids=stop_token_ids, ignore_eos=ignore_eos)  # type: ignore[arg-type]


def _prompt(prompt: Sequence[int] | None) -> list[int] | None:
    """A generate's prompt as token ids, checked before any Ray call (text goes through ``append``)."""
    if prompt is None:
        return None
    if isinstance(prompt, str):
        raise ArgumentError(f"prompt takes token ids; append text with append(), got text {prompt[:40]!r}")
    return token_ids(prompt, what="prompt token ids")


def _seed_for(temperature: float, seed: int | None) -> int | None:
    """A sampled call gets a seed here when it has none, so a retry samples the same tokens."""
    if temperature > 0 and seed is None:
        return int.from_bytes(os.urandom(4), "little")
    return seed


if TYPE_CHECKING:
    def _declared(session: Session) -> SessionSurface:
        return session  # mypy checks the session's operations against their declaration
