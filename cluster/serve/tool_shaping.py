"""Tools on the HTTP front: what a request offers, how its turn is constrained, how the reply is
shaped (chat completions and Responses alike; ``kvres.actors.tools`` does the work).

Primitives:
- ``tool_form_of_model(model) -> (family, framing)``: the tool family of a served model's chat
  template and the framing a Hermes template writes around a call (read from its file here, once);
  ``generic`` where the file cannot be read on this node.
- ``ToolPlan.of_request(model, tools, tool_choice, parallel_tool_calls, flat=False)``: the tools
  and choice validated (a 400 naming the field: ``tools[1].function.parameters``, ...);
  ``active`` (tools offered and the choice is not none), ``listed`` (the tools as templates take
  them), ``carry(messages)`` (the conversation with the tools on its first message, so the model's
  template renders them), ``constrain(plan)`` (a forced choice, ``required`` or a named function,
  adds the grammar that makes the reply a call: ``kvres.actors.tools.grammar``; a request's own
  grammar or response format beside it is a 400), ``parse(text)`` and ``stream()`` (the reply's
  calls, whole or as it streams; at most one call unless ``parallel_tool_calls``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvres.actors.tools.errors import ToolError
from kvres.actors.tools.families import family_of
from kvres.actors.tools.framing import QWEN_FRAMING, HermesFraming, hermes_framing
from kvres.actors.tools.parsing import CallStream, ParsedReply, parse_reply
from kvres.actors.tools.specs import FunctionSpec, ToolChoice, choice_of, functions_of

from .catalog import ServedModel
from .http_errors import bad_request
from .sampling_fields import GenerationPlan


@functools.lru_cache(maxsize=64)
def _tools_of_file(path: str) -> tuple[str, HermesFraming]:
    from kvres.actors.chat_source import read_chat_template

    try:
        source = read_chat_template(path)
    except Exception:  # not on this node, or not a GGUF: the generic form parses any model's JSON
        return "generic", QWEN_FRAMING
    family = family_of(source.template if source is not None else None)
    framing = hermes_framing(source) if family == "hermes" and source is not None else QWEN_FRAMING
    return family, framing


def tool_form_of_model(model: ServedModel) -> tuple[str, HermesFraming]:
    return _tools_of_file(str(model.path))


@dataclass(frozen=True)
class ToolPlan:
    functions: list[FunctionSpec]
    choice: ToolChoice
    family: str
    parallel: bool
    framing: HermesFraming = QWEN_FRAMING  # how the model's template frames a Hermes call

    @classmethod
    def of_request(cls, model: ServedModel, tools: Any, tool_choice: Any, parallel_tool_calls: bool | None,
                   flat: bool = False) -> ToolPlan:
        try:
            functions = functions_of(tools, flat=flat) if tools is not None else []
            choice = choice_of(tool_choice, functions, flat=flat)
        except ToolError as exc:
            raise bad_request(str(exc), param=exc.field) from None
        family, framing = tool_form_of_model(model) if functions else ("generic", QWEN_FRAMING)
        return cls(functions, choice, family, parallel_tool_calls is not False, framing)

    @property
    def active(self) -> bool:
        return bool(self.functions) and self.choice.mode != "none"

    @property
    def listed(self) -> list[dict[str, Any]]:
        return [f.as_tool() for f in self.functions]

    def carry(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        out = [dict(m) for m in messages]
        if self.functions and out:
            out[0]["tools"] = self.listed
        return out

    def constrain(self, plan: GenerationPlan) -> GenerationPlan:
        if not self.choice.forced:
            return plan
        if plan.request.sampling.needs_grammar:
            raise bad_request("tool_choice required or a named function constrains the reply with its own grammar; "
                              "leave grammar and the JSON response format out", param="tool_choice")
        from kvres.actors.tools.grammar import call_grammar

        offered = [f for f in self.functions if self.choice.name in (None, f.name)]
        grammar = call_grammar(self.family, offered, parallel=self.parallel and self.choice.mode == "required",
                               framing=self.framing)
        sampling = plan.request.sampling.model_copy(update={"grammar": grammar})
        request = plan.request.model_copy(update={"sampling": sampling})
        return dataclasses.replace(plan, kwargs={**plan.kwargs, "grammar": grammar}, request=request)

    def _limited(self, parsed: ParsedReply) -> ParsedReply:
        if not self.parallel and len(parsed.calls) > 1:
            return dataclasses.replace(parsed, calls=parsed.calls[:1])
        return parsed

    def parse(self, text: str) -> ParsedReply:
        if not self.active:
            return ParsedReply(text)
        return self._limited(parse_reply(self.family, text, self.functions))

    def stream(self) -> ToolStream:
        return ToolStream(self)


class ToolStream:
    """A streamed reply: text goes out as it comes until the calls may begin (``CallStream``)."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.calls = CallStream(plan.family, plan.functions) if plan.active else None

    def push(self, piece: str) -> str:
        return piece if self.calls is None else self.calls.push(piece)

    def finish(self, text: str) -> tuple[str, ParsedReply]:
        if self.calls is None:
            return "", ParsedReply(text)
        rest, parsed = self.calls.finish()
        return rest, self.plan._limited(parsed)
