"""``ToolError``: a malformed tool, schema, tool choice, tool call or tool message; ``field`` names
the request field (``tools[1].function.parameters``), the message names the value and the rule."""

from __future__ import annotations

from kvres.policy import KvresError


class ToolError(KvresError, ValueError):
    def __init__(self, message: str, field: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
