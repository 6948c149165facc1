"""The requests of ``/v1/chat/completions`` and ``/v1/completions`` (OpenAI's format), validated.

Primitives:
- ``ChatMessageIn``: ``role`` (system, developer (read as system), user, assistant, tool),
  ``content`` (a string or a list of ``{"type": "text", "text": ...}`` parts); ``as_message()`` is
  the ``{"role", "content"}`` the model's chat template renders. Tool calls, images and audio are
  refused (400 naming the field).
- ``ChatCompletionRequest``: ``model``, ``messages``, ``max_tokens`` / ``max_completion_tokens``,
  ``n`` (1), ``stream``, ``stream_options.include_usage``, ``logprobs`` / ``top_logprobs`` (0),
  ``response_format`` and the shared sampling fields (``SamplingFields``).
- ``CompletionRequest``: ``model``, ``prompt`` (a string, token ids, or a list of one of them),
  ``max_tokens`` (default 16), ``echo``, ``logprobs`` (0 or None), ``stream``, ``n`` (1),
  ``best_of`` (1), ``suffix`` (None) and the sampling fields.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator

from .sampling_fields import ResponseFormat, SamplingFields, only_chosen_logprobs


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["text", "input_text", "output_text"]
    text: StrictStr


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart]
    name: StrictStr | None = None
    tool_call_id: StrictStr | None = None

    def as_message(self) -> dict[str, str]:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


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
    def _one_choice(cls, v: int) -> int:
        if v != 1:
            raise ValueError(f"n must be 1 (one choice per request; fork a session for more), got {v}")
        return v


class ChatCompletionRequest(_Generating):
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(None, ge=0)
    max_completion_tokens: StrictInt | None = Field(None, ge=0)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto"] | None = None
    functions: list[dict[str, Any]] | None = None
    modalities: list[Literal["text"]] | None = None
    reasoning_effort: StrictStr | None = None

    @field_validator("tools", "functions")
    @classmethod
    def _no_tools(cls, v: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if v:
            raise ValueError("tools are not supported by kvres (no tool calling); leave them out")
        return v

    _no_alternatives = field_validator("top_logprobs")(only_chosen_logprobs)

    def messages_for_template(self) -> list[dict[str, str]]:
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

    @field_validator("logprobs")
    @classmethod
    def _chosen_only(cls, v: int | None) -> int | None:
        if v:
            raise ValueError(f"logprobs must be 0 or null: kvres returns the chosen tokens' log-probabilities only "
                             f"(logprobs=0), got {v}")
        return v

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
