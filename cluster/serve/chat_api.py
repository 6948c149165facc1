"""``POST /v1/chat/completions`` and ``POST /v1/completions``, in OpenAI's format.

Primitives:
- ``router``: the two routes. A chat request with an ``X-Session-Id`` header runs on that kvres
  session (opened on first use): the model's chat template renders the whole conversation the
  client sends, the session keeps what of it it already holds and appends only the rest
  (``usage.prompt_tokens_details.cached_tokens`` says how much was kept); the answer echoes the
  header. Without one, the turn runs on a session opened for the request and closed after it. A
  session lives as ``X-Session-Idle`` / ``X-Session-TTL`` on its first request ask, else as the
  server's defaults say (``lifetime``).
  ``tools`` are rendered by the model's own template and the reply's calls parsed in its family's
  form (``tool_shaping``): ``message.tool_calls`` with ``finish_reason: "tool_calls"``; a bound
  session whose reply ended in calls is paused for tools before the answer goes out
  (``Session.pause_for_tools``: parked after idle sessions until the results come). A bound
  turn's answer has a ``kvres`` field: ``session_id`` and ``prefix_break`` (where the rendered
  conversation first left what the session held: message index, token position, the text held and
  rendered there; None where it kept all of it; counted in ``kvres_serve_prefix_breaks_total``);
  streamed, on the last chunk with a choice.
  ``n`` > 1: the prompt appended once and the choices sampled on forks of its session
  (``choices.run_choices``; a bound session keeps choice 0); streamed, every choice's pieces as they
  come, each chunk's ``index`` saying whose (``choices.start_choice_streams``). ``logprobs`` /
  ``top_logprobs`` in OpenAI's shape (``logprob_shapes``).
  ``/v1/completions`` appends the prompt (text or token ids) as it is, on a one-request session.
- ``stream=true``: server-sent events, ``chat.completion.chunk`` / ``text_completion`` objects,
  ``data: [DONE]`` last; ``stream_options.include_usage`` adds a last chunk with the usage; text
  streams until calls may begin, the calls come as ``delta.tool_calls`` at the end. A client
  that leaves mid-stream keeps (on a bound session) only the tokens whose text it was sent.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from kvres.policy import KvresError

from .catalog import ServedModel
from .choices import ChoiceStreams, run_choices, start_choice_streams
from .http_errors import api_error
from .http_glue import SSE_DONE, answers_errors, note, read_request, sse, tenant_of
from .lifetime import lifetime_of
from .logprob_shapes import completion_logprobs, token_logprobs
from .openai_schemas import ChatCompletionRequest, CompletionRequest
from .sampling_fields import GenerationPlan, json_schema_of, max_tokens_of
from .service import Service
from .tool_shaping import ToolPlan, ToolStream
from .turns import Prompt, StreamingTurn, TurnOutcome, one_call, run_turn, start_streaming

router = APIRouter()
SESSION_HEADER = "x-session-id"
DEFAULT_MAX_TOKENS = 1024


def usage(prompt: int, cached: int, completion: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _chat_logprobs(outcome: TurnOutcome) -> dict[str, Any] | None:
    content = token_logprobs(outcome)
    return None if content is None else {"content": content}


class _Turn:
    """What one chat or completion request runs: its model, plan, prompt and session binding."""

    def __init__(self, service: Service, request: Request, model: ServedModel, backend: str | None,
                 plan: GenerationPlan, prompt: Prompt, session_id: str | None, chat: bool) -> None:
        self.service, self.request, self.model, self.backend = service, request, model, backend
        self.plan, self.prompt, self.session_id, self.chat = plan, prompt, session_id, chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.started = time.monotonic()
        self.headers = {"X-Session-Id": session_id} if session_id else {}
        self.lifetime = lifetime_of(service.lifetime, request.headers)  # a bad header: a 400 before any call
        self.tools: ToolPlan | None = None  # a chat turn's: its reply's calls pause the session

    def acquire(self, streamed: bool = False) -> Any:
        tenant = tenant_of(self.request)
        if self.session_id is not None:
            return self.service.bound(self.model, self.backend, self.session_id, tenant, self.lifetime)
        return self.service.stateless(self.model, self.backend, tenant,
                                      one_call=streamed and one_call(self.prompt, self.model.anchor))

    def whole(self) -> TurnOutcome:
        session, stack = self.acquire()
        with stack:
            outcome = run_turn(session, self.prompt, self.plan, self.model.anchor, self.model.local_decoder())
            if self.session_id is not None and self.tools is not None and self.tools.parse(outcome.text).calls:
                self.pause_for_tools(session)
            return outcome

    def pause_for_tools(self, session: Any) -> None:
        """The reply ended in tool calls: a bound session waits for their results (told before the
        answer goes out, so the next turn comes after)."""
        if self.session_id is not None:
            with contextlib.suppress(KvresError):  # a hint: the answer stands without it
                session.pause_for_tools()

    def choices(self, n: int) -> list[TurnOutcome]:
        """``n`` replies to one prompt, prefilled once (``choices.run_choices``)."""
        session, stack = self.acquire()
        with stack:
            return run_choices(self.service, session, self.prompt, self.plan, n, self.model.anchor,
                               self.model.local_decoder())

    def choice_streams(self, n: int) -> ChoiceStreams:
        """``n`` streamed replies to one prompt, prefilled once (``choices.start_choice_streams``)."""
        session, stack = self.acquire()  # not a one-call session: it is forked
        return start_choice_streams(self.service, session, stack, self.prompt, self.plan, n, self.started,
                                    self.model.local_decoder())

    def streaming(self) -> StreamingTurn:
        session, stack = self.acquire(streamed=True)
        return start_streaming(self.service, session, stack, self.prompt, self.plan, self.started, self.model.anchor,
                               self.model.local_decoder())

    def note(self, outcome: TurnOutcome | StreamingTurn, prefix_break: dict[str, Any] | None = None) -> None:
        if isinstance(outcome, StreamingTurn):
            note(self.request, ttft_s=outcome.ttft_s, gaps=outcome.gaps.state(), prompt_tokens=outcome.prompt_tokens,
                 cached_tokens=outcome.cached_tokens, completion_tokens=len(outcome.text.tokens),
                 session_id=self.session_id)
            if prefix_break is not None:
                note(self.request, prefix_break=prefix_break)
        else:
            note(self.request, ttft_s=time.monotonic() - self.started, prompt_tokens=outcome.prompt_tokens,
                 cached_tokens=outcome.cached_tokens, completion_tokens=outcome.completion_tokens,
                 session_id=self.session_id, prefix_break=outcome.prefix_break)

    def kvres(self, outcome: TurnOutcome) -> dict[str, Any] | None:
        """What kvres adds to a bound turn's answer."""
        if self.session_id is None:
            return None
        return {"session_id": self.session_id, "prefix_break": outcome.prefix_break}

    def envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model.id,
                "system_fingerprint": None, "choices": choices}


@router.post("/v1/chat/completions")
@answers_errors
async def chat_completions(request: Request) -> Response:
    service, req, model, backend = await read_request(request, ChatCompletionRequest)
    wanted, param = req.requested_max_tokens()
    tools = ToolPlan.of_request(model, req.tools, req.tool_choice, req.parallel_tool_calls)
    req.check_tool_turns()
    plan = tools.constrain(req.plan(max_tokens_of(wanted, DEFAULT_MAX_TOKENS, model.n_ctx, param),
                                    json_schema_of(req.response_format), req.logprobs, req.top_logprobs or 0))
    req.check_bias(model.n_vocab)
    turn = _Turn(service, request, model, backend, plan, Prompt(messages=tools.carry(req.messages_for_template())),
                 request.headers.get(SESSION_HEADER), chat=True)
    turn.tools = tools
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        if req.n > 1:
            streams = await service.run(turn.choice_streams, req.n)
            return StreamingResponse(_choices_events(turn, streams, include_usage, [tools.stream() for _ in range(req.n)]),
                                     media_type="text/event-stream", headers=turn.headers)
        started = await service.run(turn.streaming)
        return StreamingResponse(_chat_events(turn, started, include_usage, tools.stream()),
                                 media_type="text/event-stream", headers=turn.headers)
    outcomes = [await service.run(turn.whole)] if req.n == 1 else await service.run(turn.choices, req.n)
    outcome, completion = outcomes[0], sum(o.completion_tokens for o in outcomes)
    turn.note(replace(outcome, tokens=[t for o in outcomes for t in o.tokens]))  # usage counts every choice
    body = turn.envelope("chat.completion", [_choice(i, o, tools) for i, o in enumerate(outcomes)])
    body["usage"] = usage(outcome.prompt_tokens, outcome.cached_tokens, completion)
    if turn.kvres(outcome) is not None:
        body["kvres"] = turn.kvres(outcome)
    return JSONResponse(body, headers=turn.headers)


def _choice(index: int, outcome: TurnOutcome, tools: ToolPlan) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": outcome.text, "refusal": None}
    finish = outcome.finish_reason
    parsed = tools.parse(outcome.text)
    if parsed.calls:
        message["content"], finish = parsed.content, "tool_calls"
        message["tool_calls"] = [call.as_chat() for call in parsed.calls]
    return {"index": index, "message": message, "logprobs": _chat_logprobs(outcome), "finish_reason": finish}


def _tool_call_deltas(calls: list[Any], choice: int = 0) -> list[dict[str, Any]]:
    """Each call as the ``openai`` client assembles it: its id and name, then its arguments."""
    out = []
    for i, call in enumerate(calls):
        head = {"index": i, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        out.append({"index": choice, "delta": {"tool_calls": [head]}, "logprobs": None, "finish_reason": None})
        out.append({"index": choice, "delta": {"tool_calls": [{"index": i, "function": {"arguments": call.arguments}}]},
                    "logprobs": None, "finish_reason": None})
    return out


def _delta(choice: int, **delta: Any) -> dict[str, Any]:
    return {"index": choice, "delta": delta, "logprobs": None, "finish_reason": None}


def _closing(choice: int, outcome: TurnOutcome, tools: ToolStream) -> tuple[list[dict[str, Any]], bool]:
    """A streamed choice's last chunks (text held back, its calls, its logprobs, why it ended), and
    whether it ended in calls."""
    rest, parsed = tools.finish(outcome.text)
    out = [_delta(choice, content=rest)] if rest else []
    out += _tool_call_deltas(parsed.calls, choice)
    finish = "tool_calls" if parsed.calls else outcome.finish_reason
    if outcome.logprobs is not None:
        out.append({**_delta(choice), "logprobs": _chat_logprobs(outcome)})
    return [*out, {**_delta(choice), "finish_reason": finish}], bool(parsed.calls)


def _chat_events(turn: _Turn, streaming: StreamingTurn, include_usage: bool, tools: ToolStream) -> AsyncIterator[str]:
    def piece(text: str) -> dict[str, Any] | None:
        content = tools.push(text)
        return _delta(0, content=content) if content else None

    def closing(outcome: TurnOutcome) -> list[dict[str, Any]]:
        out, calls = _closing(0, outcome, tools)
        if calls:
            paused.append(streaming.session)
        return out

    paused: list[Any] = []  # the session, once the reply ended in calls
    return _events(turn, streaming, include_usage, "chat.completion.chunk",
                   opening=[_delta(0, role="assistant", content="")], piece=piece, closing=closing, paused=paused)


def _usage_and_done(turn: _Turn, obj: str, include_usage: bool, prompt: int, cached: int,
                    completion: int) -> list[str]:
    """A stream's last events: the usage chunk where the client asked for it, then ``[DONE]``."""
    if not include_usage:
        return [SSE_DONE]
    body = turn.envelope(obj, [])
    body["usage"] = usage(prompt, cached, completion)
    return [sse(body), SSE_DONE]


async def _choices_events(turn: _Turn, streams: ChoiceStreams, include_usage: bool,
                          tools: list[ToolStream]) -> AsyncIterator[str]:
    """``n`` streamed choices: each one's pieces as they come (``index`` says whose), then each one's
    closing chunks; the usage counts the prompt once and every choice's tokens."""
    obj, n = "chat.completion.chunk", len(streams.turns)
    try:
        head = "".join(sse(turn.envelope(obj, [_delta(i, role="assistant", content="")])) for i in range(n))
        async for i, text in streams.merged():
            content = tools[i].push(text)
            if content:
                yield head + sse(turn.envelope(obj, [_delta(i, content=content)]))
                head = ""
        if head:
            yield head
        outcomes = [each.outcome() for each in streams.turns]
        closings = [_closing(i, outcome, tools[i]) for i, outcome in enumerate(outcomes)]
        if closings[0][1]:  # choice 0's reply ended in calls: a bound session waits for their results
            await turn.service.run(turn.pause_for_tools, streams.turns[0].session)
        last = [chunk for out, _ in closings for chunk in out]
        for k, choice in enumerate(last):
            chunk = turn.envelope(obj, [choice])
            if k == len(last) - 1 and turn.kvres(outcomes[0]) is not None:
                chunk["kvres"] = turn.kvres(outcomes[0])
            yield sse(chunk)
        first = outcomes[0]
        turn.note(replace(first, tokens=[t for o in outcomes for t in o.tokens],
                          cached_tokens=first.prompt_tokens - streams.appended))
        for line in _usage_and_done(turn, obj, include_usage, first.prompt_tokens,
                                    first.prompt_tokens - streams.appended, sum(o.completion_tokens for o in outcomes)):
            yield line
    except Exception as exc:
        yield sse(api_error(exc).body())
        yield SSE_DONE
    finally:
        streams.end_later()


async def _events(turn: _Turn, streaming: StreamingTurn, include_usage: bool, obj: str,
                  opening: list[dict[str, Any]], piece: Callable[[str], dict[str, Any] | None],
                  closing: Callable[[TurnOutcome], list[dict[str, Any]]],
                  paused: list[Any] | None = None) -> AsyncIterator[str]:
    """The server-sent events of a streamed turn: ``opening`` choices, one per text delta, the
    ``closing`` ones, the usage chunk when asked, ``[DONE]``; an error mid-way ends it as an event.
    A delta ``piece`` makes nothing of (text held back) sends nothing. A session ``closing`` put in
    ``paused`` (its reply ended in tool calls) is told so before the closing events go out."""
    try:
        # the opening events go out with the first text, in one send: one trip less to the first token
        head = "".join(sse(turn.envelope(obj, [choice])) for choice in opening)
        async for text in streaming.deltas():
            choice = piece(text)
            if choice is not None:
                yield head + sse(turn.envelope(obj, [choice]))
                head = ""
        if head:
            yield head
        outcome = streaming.outcome()
        closing_choices = closing(outcome)
        for session in paused or ():
            await turn.service.run(turn.pause_for_tools, session)
        tail = []  # the closing events go out in one send
        for i, choice in enumerate(closing_choices):
            chunk = turn.envelope(obj, [choice])
            if i == len(closing_choices) - 1 and turn.kvres(outcome) is not None:
                chunk["kvres"] = turn.kvres(outcome)
            tail.append(sse(chunk))
        turn.note(streaming, outcome.prefix_break)
        yield "".join(tail + _usage_and_done(turn, obj, include_usage, outcome.prompt_tokens, outcome.cached_tokens,
                                             outcome.completion_tokens))
    except Exception as exc:
        yield sse(api_error(exc).body())
        yield SSE_DONE
    finally:
        turn.note(streaming)
        streaming.end_later()


@router.post("/v1/completions")
@answers_errors
async def completions(request: Request) -> Response:
    service, req, model, backend = await read_request(request, CompletionRequest)
    plan = req.plan(max_tokens_of(req.max_tokens, 16, model.n_ctx, "max_tokens"), None, req.logprobs is not None,
                    req.logprobs or 0)
    req.check_bias(model.n_vocab)
    prompt = req.prompt_value()
    turn = _Turn(service, request, model, backend, plan, Prompt(raw=prompt), None, chat=False)
    echo = ""
    if req.echo:
        echo = prompt if isinstance(prompt, str) else await service.run(_detokenize, service, model, prompt)
    if req.stream:
        started = await service.run(turn.streaming)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_completion_events(turn, started, include_usage, echo), media_type="text/event-stream")
    outcome = await service.run(turn.whole)
    turn.note(outcome)
    choice = {"index": 0, "text": echo + outcome.text, "logprobs": completion_logprobs(outcome),
              "finish_reason": outcome.finish_reason}
    body = turn.envelope("text_completion", [choice])
    body["usage"] = usage(outcome.prompt_tokens, outcome.cached_tokens, outcome.completion_tokens)
    return JSONResponse(body)


def _detokenize(service: Service, model: ServedModel, tokens: list[int]) -> str:
    return service.manager.backend(model.backends[0]).detokenize(tokens)


def _completion_events(turn: _Turn, streaming: StreamingTurn, include_usage: bool,
                       echo: str) -> AsyncIterator[str]:
    def choice(text: str, finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}

    return _events(turn, streaming, include_usage, "text_completion", opening=[choice(echo)] if echo else [],
                   piece=choice,
                   closing=lambda outcome: [choice("", outcome.finish_reason, completion_logprobs(outcome))])
