"""``GET /v1/responses/{id}/input_items`` in the OpenAI specification's shape.

Primitives:
- ``ItemListQuery``: the query: ``limit`` (1 to 100, default 20), ``order`` ("asc" or "desc",
  default "desc", the specification's), ``after`` (an item id: the page starts after it),
  ``include`` (accepted, nothing to add); ``of(query_params)`` validates them (a 400 naming the
  parameter).
- ``spec_item(item, response_id, i) -> dict``: a stored input item as the specification lists it:
  every item an ``id`` (its own, else one made from the response's id and its place) and a
  ``status``; a message ``type: "message"``, its ``role`` and ``content`` as parts
  (``input_text``, ``output_text`` on an assistant message).
- ``item_list(items, response_id, query) -> dict``: ``{object: "list", data, first_id, last_id,
  has_more}``, a page of the items in the asked order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError
from starlette.datastructures import QueryParams

from .http_errors import api_error, bad_request

_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


class ItemListQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    limit: int = Field(20, ge=1, le=100)
    order: Literal["asc", "desc"] = "desc"
    after: StrictStr | None = Field(None, min_length=1, max_length=256)
    include: list[StrictStr] | None = None

    @classmethod
    def of(cls, params: QueryParams) -> ItemListQuery:
        raw: dict[str, Any] = {}
        for key in params:
            raw[key] = params.getlist(key) if key in ("include", "include[]") else params[key]
        if "include[]" in raw:
            raw["include"] = raw.pop("include[]")
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise api_error(exc) from None


def _parts(content: Any, role: str) -> list[dict[str, Any]]:
    kind = "output_text" if role == "assistant" else "input_text"
    if isinstance(content, str):
        parts = [{"type": kind, "text": content}]
    else:
        parts = [{**part, "type": kind if part.get("type") == "text" else part.get("type", kind)} for part in content]
    return [{**part, "annotations": part.get("annotations", [])} if part["type"] == "output_text" else part
            for part in parts]


def spec_item(item: Mapping[str, Any], response_id: str, i: int) -> dict[str, Any]:
    kind = str(item.get("type", "message"))
    out: dict[str, Any] = {"id": item.get("id") or f"{_ID_PREFIX.get(kind, 'item')}_{response_id}_{i}", "type": kind}
    if kind == "message":
        out.update(role=item["role"], content=_parts(item["content"], item["role"]))
    else:
        out.update({k: v for k, v in item.items() if k not in ("id", "type", "status")})
    out["status"] = item.get("status") or "completed"
    return out


def item_list(items: Sequence[Mapping[str, Any]], response_id: str, query: ItemListQuery) -> dict[str, Any]:
    listed = [spec_item(item, response_id, i) for i, item in enumerate(items)]
    if query.order == "desc":
        listed.reverse()
    start = 0
    if query.after is not None:
        ids = [item["id"] for item in listed]
        if query.after not in ids:
            raise bad_request(f"after {query.after!r} is no input item of response {response_id!r}", param="after")
        start = ids.index(query.after) + 1
    page = listed[start:start + query.limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": start + query.limit < len(listed)}
