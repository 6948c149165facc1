"""kvres.actors.tools: tool calling the model's own way, engine-free but for the grammar.

Modules:
- ``specs``: the tools a request offers (``FunctionSpec``, ``functions_of``), ``tool_choice``
  (``ToolChoice``, ``choice_of``), a call (``ToolCall``, ``new_call_id``).
- ``errors``: ``ToolError`` (names the request field).
- ``schema_check``: parameter schemas checked, arguments validated against them.
- ``families``: the family a chat template calls tools in (``family_of``), the generic form for
  templates without tools (``generic_messages``).
- ``rendering``: a conversation with tools rendered through the model's template
  (``render_conversation``, ``ToolTemplateError``).
- ``parsing``: calls read back from a reply, whole (``parse_reply``) or streamed (``CallStream``).
- ``grammar``: GBNF that forces a call in the family's syntax (``call_grammar``).
"""
