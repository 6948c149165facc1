"""The sampling fields every generating request shares, and what they become for a kvres session.

Primitives:
- ``SamplingFields``: a pydantic base: OpenAI's ``temperature`` (0..2, default 1), ``top_p``,
  ``seed`` (any integer; reduced into llama.cpp's 32-bit range), ``frequency_penalty`` /
  ``presence_penalty`` (-2..2), ``stop`` (a string or up to 16), ``logit_bias`` (token id strings to
  a bias in [-100, 100], added to the engine's logits before sampling; a key that is no token id
  or a value out of range is a 400 naming the key), and llama-server's extensions ``top_k``, ``min_p``, ``repeat_penalty``,
  ``penalty_last_n``, ``grammar`` (GBNF), ``ignore_eos``, ``stop_token_ids``. Unknown fields are
  refused (400 naming them); ``user``, ``service_tier``, ``parallel_tool_calls``, ``prompt_cache_key``
  and ``safety_identifier`` are accepted and not acted on.
- ``GenerationPlan``: ``max_tokens``, ``kwargs`` (the keywords of ``Session.generate`` /
  ``stream``), ``stop`` and ``request`` (the ``GenerationRequest``, validated before any session is
  touched: a bad value is a 400 before anything runs).
- ``SamplingFields.plan(max_tokens, json_schema=None, logprobs=False, top_logprobs=0) -> GenerationPlan``;
  ``check_bias(n_vocab)``: every ``logit_bias`` token id is in the model's vocabulary (400 naming it).
- ``json_schema_of(response_format) -> dict | None``: ``{"type": "json_object"}`` (any JSON object)
  or ``{"type": "json_schema", "json_schema": {"schema": ...}}`` as a JSON schema for the grammar.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

from kvres.actors.generation import GenerationRequest
from kvres.actors.sampling import LOGIT_BIAS_LIMIT, SEED_LIMIT, SamplingParams

from .http_errors import api_error, bad_request


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: StrictInt | None = None
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    stop: StrictStr | list[StrictStr] | None = None
    logit_bias: dict[str, float] | None = None
    user: StrictStr | None = None
    service_tier: StrictStr | None = None
    parallel_tool_calls: StrictBool | None = None
    prompt_cache_key: StrictStr | None = None
    safety_identifier: StrictStr | None = None
    # llama-server's extensions
    top_k: StrictInt | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, lt=1.0)
    repeat_penalty: float | None = Field(None, gt=0.0)
    penalty_last_n: StrictInt | None = Field(None, ge=0)
    grammar: StrictStr | None = None
    ignore_eos: StrictBool = False
    stop_token_ids: list[StrictInt] = Field(default_factory=list)

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (v or {}).items():
            if not (key.isascii() and key.isdigit()) or len(key) > 9:
                raise ValueError(f"logit_bias key {key!r} must be a token id (a non-negative integer, as a string)")
            if not math.isfinite(bias) or not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
                raise ValueError(f"logit_bias[{key!r}] must be in [-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}], "
                                 f"got {bias}")
        return v

    def check_bias(self, n_vocab: int | None) -> None:
        """Every ``logit_bias`` token id is in the model's vocabulary (None: not known here; the
        backend's sampler checks it)."""
        for key in self.logit_bias or {}:
            if n_vocab is not None and int(key) >= n_vocab:
                raise bad_request(f"logit_bias key {key!r} is not a token id of the model: its vocabulary is "
                                  f"[0, {n_vocab})", param="logit_bias")

    def plan(self, max_tokens: int, json_schema: dict[str, Any] | None = None, logprobs: bool = False,
             top_logprobs: int = 0) -> GenerationPlan:
        sampling: dict[str, Any] = {"temperature": 1.0 if self.temperature is None else self.temperature}
        if self.seed is not None:
            sampling["seed"] = self.seed % SEED_LIMIT
        for name in ("top_p", "frequency_penalty", "presence_penalty", "top_k", "min_p", "repeat_penalty",
                     "penalty_last_n", "grammar"):
            value = getattr(self, name)
            if value is not None:
                sampling[name] = value
        if json_schema is not None:
            if self.grammar is not None:
                raise bad_request("give either grammar or a JSON schema response format, not both", param="grammar")
            sampling["json_schema"] = json_schema
        if logprobs:
            sampling["logprobs"] = True
        if top_logprobs:
            sampling["top_logprobs"] = top_logprobs
        if self.logit_bias:
            sampling["logit_bias"] = {int(key): bias for key, bias in self.logit_bias.items()}
        stop: tuple[str, ...] = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        try:
            params = SamplingParams(**sampling)
            request = GenerationRequest(max_tokens=max_tokens, sampling=params, stop=stop,
                                        stop_token_ids=tuple(self.stop_token_ids), ignore_eos=self.ignore_eos)
        except ValidationError as exc:
            raise api_error(exc) from None
        kwargs = {**sampling, "stop": stop, "stop_token_ids": tuple(self.stop_token_ids), "ignore_eos": self.ignore_eos}
        temperature = kwargs.pop("temperature")
        seed = kwargs.pop("seed", None)
        return GenerationPlan(max_tokens, temperature, seed, kwargs, stop, request)


@dataclass(frozen=True)
class GenerationPlan:
    max_tokens: int
    temperature: float
    seed: int | None
    kwargs: dict[str, Any]
    stop: tuple[str, ...]
    request: GenerationRequest


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: StrictStr = Field("response", max_length=64)
    description: StrictStr | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


def json_schema_of(fmt: ResponseFormat | None, param: str = "response_format") -> dict[str, Any] | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "object"}
    if fmt.json_schema is None:
        raise bad_request(f"{param}.json_schema is required when {param}.type is 'json_schema'",
                          param=f"{param}.json_schema")
    return fmt.json_schema.schema_ or {"type": "object"}


def max_tokens_of(value: int | None, default: int, n_ctx: int, param: str) -> int:
    if value is None:
        return min(default, n_ctx)
    if value > n_ctx:
        raise bad_request(f"{param} must be at most the model's context, {n_ctx} tokens; got {value}", param=param)
    return value
