"""A chat loop: each line read from stdin is a user turn; the model's reply is printed after it.

Run: ``.venv/bin/python examples/chat.py [--model PATH] [--system TEXT]``, type, and end with
Ctrl-D (end of input). Piped input works the same, one turn per line:
``printf 'hello\\nwhat is 2 plus 3?\\n' | .venv/bin/python examples/chat.py``.

The model is the project's default chat model unless ``--model`` names another GGUF with a chat
template. ``Session.chat`` renders the whole conversation with the model's own template and
prefills only what the session does not hold yet: each turn costs its own tokens, not the history's.
When the conversation outgrows what the session can hold (``ContextLengthError``: the backend's
KV budget), its oldest turns are left out, the system message kept, and the turn is sent again.
With ``RAY_ADDRESS`` (or ``--address``) the loop runs on that standing cluster and leaves its
actors running; without one it starts an embedded Ray that ends with the script.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator

from kvres.cluster import BackendConfig, KvresConfig, connect
from kvres.cluster.session_handle import Session
from kvres.policy import ContextLengthError


def _lines(interactive: bool) -> Iterator[str]:
    """The user's turns: read with a prompt on a terminal, echoed as ``> line`` when piped, so the
    output reads as a transcript either way."""
    while True:
        try:
            line = input("> ") if interactive else next(sys.stdin)
        except (EOFError, StopIteration):
            return
        line = line.strip()
        if not line:
            continue
        if not interactive:
            print(f"> {line}")
        yield line


def _reply(session: Session, messages: list[dict[str, str]], max_tokens: int, temperature: float) -> str:
    """The reply to the conversation's last turn; past what the session holds, the oldest turn
    (after a system message) is left out until it fits."""
    while True:
        try:
            return session.chat(messages, max_tokens=max_tokens, temperature=temperature).text or ""
        except ContextLengthError:
            first = 1 if messages[0]["role"] == "system" else 0
            if len(messages) - first < 2:
                raise  # the turn alone is too long
            del messages[first: first + 2 if messages[first + 1]["role"] == "assistant" else first + 1]
            print("(the conversation outgrew the session: its oldest turn is left out)", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a GGUF with a chat template (default: the project's chat model)")
    parser.add_argument("--system", default=None, help="a system message to start the conversation with")
    parser.add_argument("--max-tokens", type=int, default=256, help="the longest reply (default 256)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"), help="a standing cluster (RAY_ADDRESS)")
    parser.add_argument("--namespace", default="kvres")
    args = parser.parse_args()
    config = None if args.model is None else KvresConfig(backends=[BackendConfig(name="chat", model_path=args.model)])
    embedded = not args.address
    manager = connect(address=args.address, namespace=args.namespace, config=config,
                      **({"include_dashboard": False} if embedded else {}))
    messages = [{"role": "system", "content": args.system}] if args.system else []
    try:
        with manager.open_session() as session:
            for line in _lines(sys.stdin.isatty()):
                messages.append({"role": "user", "content": line})
                reply = _reply(session, messages, args.max_tokens, args.temperature)
                messages.append({"role": "assistant", "content": reply})
                print(reply, flush=True)
    finally:
        if embedded:
            manager.shutdown()


if __name__ == "__main__":
    main()
