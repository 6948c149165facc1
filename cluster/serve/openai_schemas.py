"""The requests of ``/v1/chat/completions`` and ``/v1/completions`` (OpenAI's format), validated.

Primitives:
- ``ChatMessageIn``: ``role`` (system, developer (read as system), user, assistant, tool),
  ``content`` (a string or a list of ``{"type": "text", "text": ...}`` parts; None on an
  assistant turn with ``tool_calls``), ``tool_calls`` (``ToolCallIn``: ``id``, ``type``
  "function", ``function.name``, ``function.arguments`` the JSON text of an object),
  ``tool_call_id`` (a tool result's: the id of a call made before it); ``as_message()`` is the
  message the model's chat template renders. Images and audio are refused (400 naming the field).
- ``ChatCompletionRequest``: ``model``, ``messages``, ``max_tokens`` / ``max_completion_tokens``,
  ``n`` (1 to ``MAX_CHOICES``), ``stream``, ``stream_options.include_usage``, ``logprobs`` /
  ``top_logprobs`` (0 to 20; needs ``logprobs``), ``logit_bias``,
  ``response_format``, ``tools`` / ``tool_choice`` (checked by ``tool_shaping.ToolPlan``; the
  legacy ``functions`` refused) and the shared sampling fields (``SamplingFields``);
  ``check_tool_turns()``: every tool result answers a call made before it (400 naming the field).
- ``CompletionRequest``: ``model``, ``prompt`` (a string, token ids, or a list of one of them),
  ``max_tokens`` (default 16), ``echo``, ``logprobs`` (None, or 0 to 5: how many of each step's most
  likely tokens to give), ``stream``, ``n`` (1),
  ``best_of`` (1), ``suffix`` (None) and the sampling fields.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from .http_errors import bad_request
from .sampling_fields import ResponseFormat, SamplingFields

MAX_CHOICES = 8  # the most choices (n) one chat completion asks for


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["text", "input_text", "output_text"]
    text: StrictStr


def json_object_text(v: str) -> str:
    """``arguments``: the JSON text of an object (a pydantic validator)."""
    try:
        value = json.loads(v)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"arguments must be the JSON text of an object, got {v!r:.60}")
    return v


class FunctionCallIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: StrictStr = Field(min_length=1, max_length=64)
    arguments: StrictStr

    _json_object = field_validator("arguments")(json_object_text)


class ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: StrictStr = Field(min_length=1, max_length=128)
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None
    name: StrictStr | None = None
    tool_call_id: StrictStr | None = Field(None, min_length=1, max_length=128)
    tool_calls: list[ToolCallIn] | None = None
    refusal: StrictStr | None = None

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessageIn:
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError(f"tool_calls belong on an assistant message, not a {self.role} one")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (it may be null only on an assistant message with tool_calls)")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        if self.role != "tool" and self.tool_call_id is not None:
            raise ValueError(f"tool_call_id belongs on a tool message, not a {self.role} one")
        return self

    def as_message(self) -> dict[str, Any]:
        content = self.content
        text = content if isinstance(content, str) or content is None else "".join(p.text for p in content)
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": text}
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    include_usage: StrictBool = False
    include_obfuscation: StrictBool | None = None


class _Generating(SamplingFields):
    model: StrictStr
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    store: StrictBool | None = None
    metadata: dict[str, StrictStr] | None = None

    @field_validator("n")
    @classmethod
    def _choices(cls, v: int) -> int:
        if v != 1:
            raise ValueError(f"n must be 1 on /v1/completions (chat completions take up to {MAX_CHOICES}), got {v}")
        return v


class ChatCompletionRequest(_Generating):
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(None, ge=0)
    max_completion_tokens: StrictInt | None = Field(None, ge=0)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Any] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: Any = None
    modalities: list[Literal["text"]] | None = None
    reasoning_effort: StrictStr | None = None

    @field_validator("functions", "function_call")
    @classmethod
    def _no_functions(cls, v: Any) -> Any:
        if v:
            raise ValueError("the legacy functions / function_call fields are not supported; give tools and "
                             "tool_choice instead")
        return v

    def check_tool_turns(self) -> None:
        """Each tool result answers a call an earlier assistant message made (400 naming it)."""
        made: set[str] = set()
        for i, message in enumerate(self.messages):
            for call in message.tool_calls or ():
                made.add(call.id)
            if message.role == "tool" and message.tool_call_id not in made:
                raise bad_request(f"messages[{i}].tool_call_id {message.tool_call_id!r} answers no tool call made "
                                  f"before it (the calls made: {sorted(made)})", param=f"messages.{i}.tool_call_id")

    @field_validator("n")
    @classmethod
    def _choices(cls, v: int) -> int:
        if not 1 <= v <= MAX_CHOICES:
            raise ValueError(f"n must be in [1, {MAX_CHOICES}], got {v}")
        return v

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError(f"top_logprobs ({self.top_logprobs}) needs logprobs: true")
        return self

    def messages_for_template(self) -> list[dict[str, Any]]:
        return [m.as_message() for m in self.messages]

    def requested_max_tokens(self) -> tuple[int | None, str]:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"


class CompletionRequest(_Generating):
    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]
    max_tokens: StrictInt | None = Field(16, ge=0)
    echo: StrictBool = False
    logprobs: StrictInt | None = Field(None, ge=0, le=5)
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: Any) -> Any:
        if isinstance(v, list) and v and isinstance(v[0], (str, list)):
            if len(v) != 1:
                raise ValueError(f"one prompt per request (got a batch of {len(v)})")
            v = v[0]
        if isinstance(v, (str, list)) and not v:
            raise ValueError("prompt must not be empty")
        if isinstance(v, list) and any(t < 0 for t in v):
            raise ValueError("token ids must be >= 0")
        return v

    def prompt_value(self) -> str | list[int]:
        """The one prompt: its text, or its token ids."""
        value: Any = self.prompt
        if isinstance(value, list) and value and isinstance(value[0], (str, list)):
            value = value[0]
        return value if isinstance(value, str) else [int(t) for t in value]

    @field_validator("best_of")
    @classmethod
    def _best_of_one(cls, v: int | None) -> int | None:
        if v not in (None, 1):
            raise ValueError(f"best_of must be 1, got {v}")
        return v

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix (insertion) is not supported by kvres; leave it out")
        return v
