"""A chat loop: each line read from stdin is a user turn; the model's reply is printed after it.

Run: ``.venv/bin/python examples/chat.py [--model PATH] [--system TEXT]``, type, and end with
Ctrl-D (end of input). Piped input works the same, one turn per line:
``printf 'hello\\nwhat is 2 plus 3?\\n' | .venv/bin/python examples/chat.py``.

It is ``kvres chat`` (``kvres.cluster.cli.chat``), which takes the same options: the model is the
project's default chat model unless ``--model`` names another GGUF with a chat template; its
context and KV memory are chosen for it and printed first (on stderr). ``Session.chat`` renders the
whole conversation with the model's own template and prefills only what the session does not hold
yet: each turn costs its own tokens, not the history's. When the conversation outgrows what the
session can hold (``ContextLengthError``), its oldest turns are left out, the system message kept,
and the turn is sent again. With ``RAY_ADDRESS`` (or ``--address``) the loop runs on that standing
cluster and leaves its actors running; without one it starts an embedded Ray that ends with the
script.
"""

from __future__ import annotations

import sys

from kvres.cluster.cli import main

if __name__ == "__main__":
    sys.exit(main(["chat", *sys.argv[1:]]))
