"""``kvres chat [--model PATH.gguf] [--system TEXT] ...``: a terminal chat on one kvres session.

Primitives:
- ``register(subparsers)`` / ``run(args) -> int``: the command (``kvres.cluster.cli`` registers
  it; ``examples/chat.py`` is a thin wrapper of it).
- ``read_turns(interactive) -> Iterator[str]``: the user's turns, one a line (blank lines are
  none): read with a ``> `` prompt on a terminal, echoed as ``> line`` when piped, so the output
  reads as a transcript either way.
- ``reply(session, messages, max_tokens, temperature) -> str``: the reply to the conversation's
  last turn; past what the session holds (``ContextLengthError``), the oldest turn after a system
  message is left out (said on stderr) and the turn sent again.

The model is ``--model``, else the project's default chat model; its context, KV memory, layout
and policy are chosen for it (``kvres.cluster.model_setup``) and printed on stderr before the
first turn. With ``--address`` (or ``RAY_ADDRESS``) the chat runs on that standing cluster with
its configuration (``--model``: a session on a backend of that model) and leaves its actors running;
without one it starts an embedded Ray that ends with the command. ``Session.chat`` renders the
whole conversation with the model's own template and prefills only what the session does not hold
yet: each turn costs its own tokens, not the history's.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from typing import Any

from kvres.policy import ContextLengthError


def read_turns(interactive: bool) -> Iterator[str]:
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


def reply(session: Any, messages: list[dict[str, str]], max_tokens: int, temperature: float) -> str:
    while True:
        try:
            return str(session.chat(messages, max_tokens=max_tokens, temperature=temperature).text or "")
        except ContextLengthError:
            first = 1 if messages[0]["role"] == "system" else 0
            if len(messages) - first < 2:
                raise  # the turn alone is too long
            del messages[first: first + 2 if messages[first + 1]["role"] == "assistant" else first + 1]
            print("(the conversation outgrew the session: its oldest turn is left out)", file=sys.stderr, flush=True)


def register(subparsers: Any) -> None:
    cmd = subparsers.add_parser("chat", help="a terminal chat on one session (each line a turn; Ctrl-D ends it)")
    cmd.add_argument("--model", default=None, metavar="PATH.gguf",
                     help="a GGUF chat model (default: the project's chat model)")
    cmd.add_argument("--kv-memory", default=None, metavar="SIZE",
                     help="the KV memory, e.g. 2GiB (default: half the free GPU or host memory less the weights)")
    cmd.add_argument("--threads", type=int, default=None, metavar="N",
                     help="the engine's CPU threads (default: the machine's cores, at most 4)")
    cmd.add_argument("--system", default=None, help="a system message to start the conversation with")
    cmd.add_argument("--max-tokens", type=int, default=256, help="the longest reply (default 256)")
    cmd.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    cmd.add_argument("--address", default=None, help="a standing cluster (default: RAY_ADDRESS, else an embedded one)")
    cmd.add_argument("--namespace", default="kvres", help="the namespace kvres runs in (default: kvres)")
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvres.actors.default_model import default_model_path

    from ..capacity_report import parse_bytes
    from ..model_setup import chat_setup, check_chat_model
    from ..session import connect

    if args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    address = args.address or os.environ.get("RAY_ADDRESS") or None
    config, model = None, None
    if address is None:
        setup = chat_setup(args.model or default_model_path(),
                           None if args.kv_memory is None else parse_bytes(args.kv_memory), n_threads=args.threads)
        config = setup.config
        print(setup.summary("kvres chat"), file=sys.stderr, flush=True)
    elif args.kv_memory is not None:
        raise ValueError("--kv-memory sizes the model of an embedded cluster; a standing cluster's backends have theirs")
    elif args.threads is not None:
        raise ValueError("--threads sets the engine of an embedded cluster; a standing cluster's backends have theirs")
    elif args.model is not None:
        model = check_chat_model(args.model)  # served by one of the cluster's backends (placement picks it)
    manager = connect(address=address, namespace=args.namespace, config=config,
                      **({} if address else {"include_dashboard": False}))
    messages = [{"role": "system", "content": args.system}] if args.system else []
    try:
        with manager.open_session(model) as session:
            for line in read_turns(sys.stdin.isatty()):
                messages.append({"role": "user", "content": line})
                text = reply(session, messages, args.max_tokens, args.temperature)
                messages.append({"role": "assistant", "content": text})
                print(text, flush=True)
    finally:
        if address is None:
            manager.shutdown()
    return 0
