"""The request of ``POST /v1/responses`` (OpenAI's Responses API, the OpenResponses specification).

Primitives:
- ``InputMessage``: an input item ``{"type": "message" (optional), "role", "content"}``, content a
  string or ``input_text`` / ``output_text`` parts; ``as_message()``.
- ``FunctionCallItem`` (``type: "function_call"``, ``call_id``, ``name``, ``arguments``: the JSON
  text of an object) and ``FunctionCallOutputItem`` (``type: "function_call_output"``,
  ``call_id``, ``output``): a call the model made and its result. Other item types (images,
  files) are refused, naming the item.
- ``chat_messages(items, made) -> list[dict]``: input items as the chat messages a template
  renders: calls joined to the assistant message before them (one turn, as the model wrote it),
  each output a ``tool`` message; an output whose ``call_id`` answers no call made before it (in
  ``made`` or among the items) is a 400 naming ``input[i].call_id``.
- ``TextConfig``: ``text.format``: ``{"type": "text"}``, ``{"type": "json_object"}`` or
  ``{"type": "json_schema", "name", "schema", "strict"}``.
- ``ResponseRequest``: ``model``, ``input`` (a string or a list of items), ``instructions``,
  ``previous_response_id``, ``max_output_tokens``, ``store`` (default true), ``stream``, ``text``,
  ``metadata``, ``truncation`` ("disabled"), ``tools`` / ``tool_choice`` (functions; checked by
  ``tool_shaping.ToolPlan``), ``reasoning`` (none), ``background`` (false) and the shared
  sampling fields; ``input_items()``, ``json_schema()``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator

from .http_errors import bad_request
from .openai_schemas import TextPart, json_object_text
from .sampling_fields import (
    JsonSchemaFormat,
    ResponseFormat,
    SamplingFields,
    json_schema_of,
)


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]
    id: StrictStr | None = None
    status: StrictStr | None = None

    def as_message(self) -> dict[str, str]:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}

    def item(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class FunctionCallItem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["function_call"]
    call_id: StrictStr = Field(min_length=1, max_length=128)
    name: StrictStr = Field(min_length=1, max_length=64)
    arguments: StrictStr
    id: StrictStr | None = None
    status: StrictStr | None = None

    _json_object = field_validator("arguments")(json_object_text)

    def item(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class FunctionCallOutputItem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["function_call_output"]
    call_id: StrictStr = Field(min_length=1, max_length=128)
    output: StrictStr | list[TextPart]
    id: StrictStr | None = None
    status: StrictStr | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)

    def item(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


InputItem = InputMessage | FunctionCallItem | FunctionCallOutputItem


def chat_messages(items: list[InputItem], made: set[str]) -> list[dict[str, Any]]:
    made = set(made)
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        if isinstance(item, InputMessage):
            out.append(item.as_message())
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            made.add(item.call_id)
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            if item.call_id not in made:
                raise bad_request(f"input[{i}].call_id {item.call_id!r} answers no function_call made before it "
                                  f"(the calls made: {sorted(made)})", param=f"input[{i}].call_id")
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
    return out


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"] = "text"
    name: StrictStr | None = Field(None, max_length=64)
    description: StrictStr | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: StrictBool | None = None


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: TextFormat = TextFormat()
    verbosity: StrictStr | None = None


class ResponseRequest(SamplingFields):
    model: StrictStr
    input: StrictStr | list[InputItem]
    instructions: StrictStr | None = None
    previous_response_id: StrictStr | None = Field(None, min_length=1, max_length=128)
    max_output_tokens: StrictInt | None = Field(None, ge=0)
    store: StrictBool = True
    stream: StrictBool = False
    text: TextConfig | None = None
    metadata: dict[StrictStr, StrictStr] | None = None
    truncation: Literal["disabled"] | None = None
    tools: list[Any] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    background: StrictBool = False
    include: list[StrictStr] | None = None
    top_logprobs: StrictInt | None = Field(None, ge=0, le=20)
    stream_options: dict[str, Any] | None = None

    @field_validator("input")
    @classmethod
    def _some_input(cls, v: str | list[InputItem]) -> str | list[InputItem]:
        if isinstance(v, list) and not v:
            raise ValueError("input must hold at least one item")
        return v

    @field_validator("reasoning")
    @classmethod
    def _no_reasoning(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v and any(value is not None for value in v.values()):
            raise ValueError("reasoning options are not supported by kvres; leave them out")
        return v

    @field_validator("background")
    @classmethod
    def _foreground(cls, v: bool) -> bool:
        if v:
            raise ValueError("background responses are not supported by kvres; set background to false")
        return v

    def input_items(self) -> list[InputItem]:
        if isinstance(self.input, str):
            return [InputMessage(role="user", content=self.input)]
        return list(self.input)

    def json_schema(self) -> dict[str, Any] | None:
        fmt = (self.text or TextConfig()).format
        if fmt.type == "json_schema":
            return json_schema_of(ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(
                name=fmt.name or "response", schema=fmt.schema_ or {})), "text.format")
        return json_schema_of(ResponseFormat(type=fmt.type), "text.format")

    def wants_logprobs(self) -> bool:
        return bool(self.include and "message.output_text.logprobs" in self.include)
