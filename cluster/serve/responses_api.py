"""``/v1/responses``: OpenAI's Responses API (the OpenResponses specification) on kvres sessions.

Primitives:
- ``router``: ``POST /v1/responses``, ``GET /v1/responses/{id}``, ``DELETE /v1/responses/{id}``,
  ``GET /v1/responses/{id}/input_items`` (the specification's paged list: ``input_items``).
- ``include: ["message.output_text.logprobs"]`` gives the reply's log-probabilities, with
  ``top_logprobs`` (0 to 20) of each step's most likely tokens.
- A response id names a point of a kvres session (its id and its log length then; ``records``).
  ``previous_response_id`` continues from it: from the session's latest point, only the new input
  is appended; from an older one the session is forked there (``Session.fork``, then ``truncate``
  of the branch to the point), so a branch costs only its new tokens. ``instructions`` apply to the
  response they come with (a system message first, as the specification says): a continuation
  whose instructions differ from the previous response's is rendered anew on a branch, so the
  stored point is never rewritten; ``store=false``
  keeps nothing: a session it opened or forked is closed after the answer (so is one whose
  response failed or whose client left mid-stream). A chain's session lives as the first
  response's ``X-Session-Idle`` / ``X-Session-TTL`` ask, else as the server's defaults say
  (``lifetime``); once its TTL closed it, a continuation of it is a 404.
- ``stream=true``: the specification's events, in order: ``response.created``,
  ``response.in_progress``, ``response.output_item.added``, ``response.content_part.added``,
  ``response.output_text.delta`` (one per piece of text), ``response.output_text.done``,
  ``response.content_part.done``, ``response.output_item.done``, then ``response.completed`` (or
  ``response.incomplete`` when ``max_output_tokens`` ended it, ``response.failed`` on an error),
  each with its ``sequence_number``. With ``tools`` the message's events open with its first text
  (none where the reply is only calls), and each call follows as a ``function_call`` item:
  ``response.output_item.added``, ``response.function_call_arguments.delta`` / ``.done``,
  ``response.output_item.done``.
- Tools: ``tools`` of type function rendered by the model's own template, the reply's calls parsed
  in its family's form (``tool_shaping``) into ``function_call`` output items (``call_id``,
  ``name``, ``arguments``); ``function_call`` / ``function_call_output`` input items are the
  conversation's tool turns, so a ``previous_response_id`` chain through tool calls keeps every
  item in the session and each step appends only its new items; a stored response that ended in
  calls pauses its session for tools (``Session.pause_for_tools``) before it is answered.
- A stored response belongs to the tenant of the API key that made it: another tenant's key is
  answered as if it did not exist (404), whether it reads, deletes or continues from it.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from kvres.actors.tools.parsing import ParsedReply
from kvres.policy import KvresError, UnknownSessionError

from ..session_handle import Session
from .catalog import ServedModel
from .http_errors import ApiError, api_error, bad_request, not_found
from .http_glue import answers_errors, note, read_request, service_of, sse, tenant_of
from .input_items import ItemListQuery, item_list
from .lifetime import SessionLifetime, lifetime_of
from .logprob_shapes import token_logprobs
from .owners import may_use
from .records import ResponseRecord
from .responses_schemas import ResponseRequest, chat_messages
from .sampling_fields import GenerationPlan, max_tokens_of
from .service import Service
from .tool_shaping import ToolPlan
from .turns import Prompt, StreamingTurn, TurnOutcome, run_turn, start_streaming

router = APIRouter()
DEFAULT_MAX_OUTPUT_TOKENS = 1024


def _new_session_id() -> str:
    return f"resp-{uuid.uuid4().hex[:20]}"


@dataclass
class _Call:
    """One ``POST /v1/responses``: its request, the point it continues from, what it produced."""

    service: Service
    req: ResponseRequest
    model: ServedModel
    backend: str | None
    plan: GenerationPlan
    tools: ToolPlan
    tenant: str | None = None  # the label of the request's API key: a session it opens counts against it
    lifetime: SessionLifetime | None = None  # a session it opens: its idle and TTL clocks (None: the service's)
    id: str = field(default_factory=lambda: f"resp_{uuid.uuid4().hex}")
    message_id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")
    created_at: float = field(default_factory=time.time)
    started: float = field(default_factory=time.monotonic)
    history: list[dict[str, Any]] = field(default_factory=list)
    session: Session | None = None
    kept: bool = False  # stored: the session it opened or forked stays open for the next response
    parsed: ParsedReply | None = None  # the reply's text and calls, read once
    call_item_ids: list[str] = field(default_factory=list)

    def _close_unless_kept(self, session: Session) -> None:
        if not self.kept:
            self.service.close_quietly(session)

    @property
    def inputs(self) -> list[dict[str, Any]]:
        made = {c["id"] for m in self.history for c in m.get("tool_calls") or ()}
        return chat_messages(self.req.input_items(), made)

    def context(self) -> list[dict[str, Any]]:
        system = [{"role": "system", "content": self.req.instructions}] if self.req.instructions else []
        return self.tools.carry(system + self.history + self.inputs)

    def read(self, outcome: TurnOutcome) -> ParsedReply:
        if self.parsed is None:
            self.parsed = self.tools.parse(outcome.text)
        return self.parsed

    # -- the session this response runs on ----------------------------------------------------
    def acquire(self) -> tuple[Session, contextlib.ExitStack]:
        service, req = self.service, self.req
        if req.previous_response_id is None:
            sid = _new_session_id()
            stack, _ = service.lease(sid)
            try:
                session = service.open_session(self.model, self.backend, sid, self.tenant, self.lifetime)
            except BaseException:
                stack.close()
                raise
            stack.callback(self._close_unless_kept, session)
            return session, stack
        previous = _readable(service, service.state.get_response(req.previous_response_id), self.tenant)
        if previous is None:
            raise not_found(f"no stored response {req.previous_response_id!r} (never stored, deleted, or "
                            "answered with store=false)", param="previous_response_id", code="response_not_found")
        if previous.response.get("model") not in (None, self.model.id):
            raise bad_request(f"response {previous.id!r} was made by model {previous.response.get('model')!r}, "
                              f"not {self.model.id!r}", param="model")
        self.history = list(previous.conversation)
        stack, owner = service.lease(previous.session_id)
        try:
            try:
                session = service.session(previous.session_id, self.tenant, owner)
            except UnknownSessionError:
                raise not_found(f"the session of response {previous.id!r} was closed", param="previous_response_id",
                                code="response_not_found") from None
            held = len(session.tokens())
            if held < previous.length:
                raise ApiError(409, f"session {previous.session_id!r} was rolled back past response {previous.id!r}",
                               param="previous_response_id", code="response_gone")
            if held == previous.length and (req.instructions or None) == (previous.response.get("instructions") or None):
                return session, stack  # its latest point: only the new input is appended
            # an older point, or other instructions (they come first, so the whole conversation is
            # rendered anew): a branch, and the stored point stays as it was for whoever continues it
            branch = session.fork(_new_session_id())
            service.claim(branch.session_id, self.tenant)
        except BaseException:
            stack.close()
            raise
        stack.close()
        stack, _ = service.lease(branch.session_id)
        try:
            branch.truncate(previous.length)
        except BaseException:
            stack.close()
            service.close_quietly(branch)
            raise
        stack.callback(self._close_unless_kept, branch)
        return branch, stack

    def whole(self) -> TurnOutcome:
        session, stack = self.acquire()
        with stack:
            self.session = session
            outcome = run_turn(session, Prompt(messages=self.context()), self.plan, self.model.anchor,
                               self.model.local_decoder())
            self.read(outcome)
            self.store(outcome)
            return outcome

    def streaming(self) -> StreamingTurn:
        session, stack = self.acquire()
        self.session = session
        return start_streaming(self.service, session, stack, Prompt(messages=self.context()), self.plan, self.started,
                               self.model.anchor, self.model.local_decoder())

    # -- the answer ---------------------------------------------------------------------------
    def message(self, text: str, status: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}]
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant",
                "content": content if text or status != "in_progress" else []}

    def body(self, status: str, output: list[dict[str, Any]], outcome: TurnOutcome | None = None,
             error: dict[str, Any] | None = None) -> dict[str, Any]:
        req = self.req
        fmt = (req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text else {"type": "text"})
        body: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": int(self.created_at), "status": status,
            "background": False, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "max_tool_calls": None,
            "model": self.model.id, "output": output, "parallel_tool_calls": self.tools.parallel,
            "previous_response_id": req.previous_response_id, "reasoning": {"effort": None, "summary": None},
            "service_tier": "default", "store": req.store, "temperature": self.plan.temperature,
            "text": {"format": fmt}, "tool_choice": req.tool_choice or self.tools.choice.mode,
            "tools": [{"type": "function", **t["function"]} for t in self.tools.listed],
            "top_logprobs": req.top_logprobs or 0,
            "top_p": req.top_p if req.top_p is not None else 1.0, "truncation": "disabled",
            "usage": None, "user": req.user, "metadata": req.metadata or {},
        }
        if outcome is not None:
            body["usage"] = {"input_tokens": outcome.prompt_tokens,
                             "input_tokens_details": {"cached_tokens": outcome.cached_tokens},
                             "output_tokens": outcome.completion_tokens,
                             "output_tokens_details": {"reasoning_tokens": 0},
                             "total_tokens": outcome.prompt_tokens + outcome.completion_tokens}
        if self.session is not None:
            body["kvres"] = {"session_id": self.session.session_id,
                             "session_length": None if outcome is None else outcome.length,
                             "prefix_break": None if outcome is None else outcome.prefix_break}
        return body

    def call_items(self, parsed: ParsedReply) -> list[dict[str, Any]]:
        while len(self.call_item_ids) < len(parsed.calls):
            self.call_item_ids.append(f"fc_{uuid.uuid4().hex}")
        return [{"type": "function_call", "id": item_id, "call_id": call.id, "name": call.name,
                 "arguments": call.arguments, "status": "completed"}
                for item_id, call in zip(self.call_item_ids, parsed.calls, strict=False)]

    def final(self, outcome: TurnOutcome) -> dict[str, Any]:
        status = "incomplete" if outcome.finish_reason == "length" else "completed"
        logprobs = token_logprobs(outcome)
        parsed = self.read(outcome)
        if not parsed.calls:
            return self.body(status, [self.message(outcome.text, status, logprobs)], outcome)
        message = [self.message(parsed.content, status, logprobs)] if parsed.content else []
        return self.body(status, message + self.call_items(parsed), outcome)

    def reply_message(self, outcome: TurnOutcome) -> dict[str, Any]:
        """The reply as the conversation's assistant message (its calls included)."""
        parsed = self.read(outcome)
        if not parsed.calls:
            return {"role": "assistant", "content": outcome.text}
        return {"role": "assistant", "content": parsed.content, "tool_calls": [c.as_chat() for c in parsed.calls]}

    def store(self, outcome: TurnOutcome) -> None:
        if not self.req.store or self.session is None:
            return
        record = ResponseRecord(
            id=self.id, session_id=self.session.session_id, length=outcome.length,
            conversation=self.history + self.inputs + [self.reply_message(outcome)],
            input_items=[m.item() for m in self.req.input_items()], response=self.final(outcome),
            created_at=self.created_at, tenant=self.tenant)
        orphans = self.service.state.put_response(record)
        self.kept = True
        if self.read(outcome).calls:  # its results come in the next response: the session waits for them
            with contextlib.suppress(KvresError):  # a hint: the answer stands without it
                self.session.pause_for_tools()
        for orphan in orphans:
            with contextlib.suppress(Exception):
                self.service.close_quietly(self.service.manager.session(orphan))


@router.post("/v1/responses")
@answers_errors
async def create_response(request: Request) -> Response:
    service, req, model, backend = await read_request(request, ResponseRequest)
    tools = ToolPlan.of_request(model, req.tools, req.tool_choice, req.parallel_tool_calls, flat=True)
    plan = tools.constrain(req.plan(max_tokens_of(req.max_output_tokens, DEFAULT_MAX_OUTPUT_TOKENS, model.n_ctx,
                                                  "max_output_tokens"), req.json_schema(), req.wants_logprobs(),
                                    (req.top_logprobs or 0) if req.wants_logprobs() else 0))
    req.check_bias(model.n_vocab)
    call = _Call(service, req, model, backend, plan, tools, tenant_of(request),
                 lifetime_of(service.lifetime, request.headers))
    if req.stream:
        started = await service.run(call.streaming)
        return StreamingResponse(_events(request, call, started), media_type="text/event-stream")
    outcome = await service.run(call.whole)
    note(request, ttft_s=time.monotonic() - call.started, prompt_tokens=outcome.prompt_tokens,
         cached_tokens=outcome.cached_tokens, completion_tokens=outcome.completion_tokens,
         session_id=call.session.session_id if call.session and req.store else None,
         prefix_break=outcome.prefix_break)
    return JSONResponse(call.final(outcome))


async def _events(request: Request, call: _Call, streaming: StreamingTurn) -> AsyncIterator[str]:
    seq = [0]

    def event(kind: str, **data: Any) -> str:
        payload = {"type": kind, "sequence_number": seq[0], **data}
        seq[0] += 1
        return sse(payload, event=kind)

    where = {"item_id": call.message_id, "output_index": 0, "content_index": 0}
    text = ""
    opened = False
    tools = call.tools.stream()

    def opening() -> list[str]:
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [event("response.output_item.added", output_index=0, item=call.message("", "in_progress")),
                event("response.content_part.added", **where, part=part)]

    try:
        yield event("response.created", response=call.body("in_progress", []))
        yield event("response.in_progress", response=call.body("in_progress", []))
        if not call.tools.active:  # with tools, the message opens with its first text (a reply may be only calls)
            opened = True
            for line in opening():
                yield line
        async for piece in streaming.deltas():
            content = tools.push(piece)
            if content:
                head = "" if opened else "".join(opening())
                opened = True
                text += content
                yield head + event("response.output_text.delta", **where, delta=content, logprobs=[])
        outcome = streaming.outcome()
        rest, parsed = tools.finish(outcome.text)
        call.parsed = parsed if parsed.calls else None
        if rest:
            head = "" if opened else "".join(opening())
            opened = True
            text += rest
            yield head + event("response.output_text.delta", **where, delta=rest, logprobs=[])
        await call.service.run(call.store, outcome)
        final = call.final(outcome)
        items = final["output"]
        if opened and items and items[0]["type"] == "message":
            item = items[0]
            said = item["content"][0]["text"]
            yield event("response.output_text.done", **where, text=said, logprobs=item["content"][0]["logprobs"])
            yield event("response.content_part.done", **where, part=item["content"][0])
            yield event("response.output_item.done", output_index=0, item=item)
        for index, item in enumerate(items):
            if item["type"] == "function_call":
                for line in _call_events(event, index, item):
                    yield line
        yield event("response.completed" if final["status"] == "completed" else "response.incomplete", response=final)
        note(request, prefix_break=outcome.prefix_break)
        _note(request, call, streaming)
    except Exception as exc:
        err = api_error(exc)
        failed = call.body("failed", [call.message(text, "incomplete")] if text else [],
                           error={"code": err.code or "server_error", "message": err.message})
        yield event("response.failed", response=failed)
    finally:
        _note(request, call, streaming)
        streaming.end_later()


def _call_events(event: Callable[..., str], index: int, item: dict[str, Any]) -> list[str]:
    where = {"item_id": item["id"], "output_index": index}
    return [event("response.output_item.added", output_index=index,
                  item={**item, "arguments": "", "status": "in_progress"}),
            event("response.function_call_arguments.delta", **where, delta=item["arguments"]),
            event("response.function_call_arguments.done", **where, arguments=item["arguments"]),
            event("response.output_item.done", output_index=index, item=item)]


def _note(request: Request, call: _Call, streaming: StreamingTurn) -> None:
    note(request, ttft_s=streaming.ttft_s, gaps=streaming.gaps.state(), prompt_tokens=streaming.prompt_tokens,
         cached_tokens=streaming.cached_tokens, completion_tokens=len(streaming.text.tokens),
         session_id=call.session.session_id if call.session and call.req.store else None)


@router.get("/v1/responses/{response_id}")
@answers_errors
async def get_response(request: Request, response_id: str) -> Response:
    return JSONResponse((await _stored(request, response_id)).response)


@router.get("/v1/responses/{response_id}/input_items")
@answers_errors
async def input_items(request: Request, response_id: str) -> Response:
    query = ItemListQuery.of(request.query_params)
    record = await _stored(request, response_id)
    return JSONResponse(item_list(record.input_items, response_id, query))


def _readable(service: Service, record: ResponseRecord | None, tenant: str | None) -> ResponseRecord | None:
    """``record`` where the caller's tenant may use it; another tenant's is answered as missing."""
    if record is None or (service.fenced and not may_use(record.tenant, tenant)):
        return None
    return record


async def _stored(request: Request, response_id: str) -> ResponseRecord:
    service = service_of(request)
    record = _readable(service, await service.run(service.state.get_response, response_id), tenant_of(request))
    if record is None:
        raise not_found(f"no stored response {response_id!r}", param="response_id", code="response_not_found")
    return record


@router.delete("/v1/responses/{response_id}")
@answers_errors
async def delete_response(request: Request, response_id: str) -> Response:
    service = service_of(request)

    def delete() -> bool:
        if _readable(service, service.state.get_response(response_id), tenant_of(request)) is None:
            return False
        record, orphan = service.state.delete_response(response_id)
        if orphan is not None:
            with contextlib.suppress(UnknownSessionError):
                service.close_quietly(service.manager.session(orphan))
        return record is not None

    if not await service.run(delete):
        raise not_found(f"no stored response {response_id!r}", param="response_id", code="response_not_found")
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})
