"""HTTP chat clients against ``kvres serve``: session-bound (``X-Session-Id``) against stateless.

Run: ``.venv/bin/python -m benchmarks.serve [--clients 8] [--turns 10] [--conversation-tokens 512]
[--history-tokens 0] [--reply-tokens 16] [--repeats 3] [--threads 2] [--kv-layout split|unified] [--layers 12 --hidden 768 --heads 12 --kv-heads 4 --ff 2048
--vocab 32000] [--model PATH] [--out DIR]`` (or ``--peer llama-server ...``). Writes ``serve.json`` and ``serve.png`` into DIR
(default benchmarks/results).

- The model: a random-weight llama GGUF of realistic shape written by ``benchmarks.realistic_model``
  with its chat template (``CHAT_TEMPLATE``), unless ``--model`` (a GGUF with a chat template).
- The server: a local Ray cluster with one kvres backend and the Serve application
  (``kvres.cluster.serve``) on a free port of 127.0.0.1, in this process; stopped at the end.
- ``--clients`` threads, each holding one conversation of ``--turns`` turns that grows to about
  ``--conversation-tokens`` tokens: each turn a user message of random words, then a streamed reply
  of ``--reply-tokens`` tokens (plain letters: a grammar keeps the random model's replies text).
  Every client sends the whole conversation each turn, as chat apps do. ``--history-tokens H``:
  each conversation starts with earlier exchanges of about H tokens (a chat resumed), sent with
  its first turn; the turns then grow it by about ``--conversation-tokens`` more.
- Two modes in one run, on the same server: ``stateless`` (no header: every turn prefills the
  whole history) and ``bound`` (each client's ``X-Session-Id``: the session holds the history,
  only the new turn is prefilled), ``--repeats`` times each, alternating which goes first (the
  machine's load drifts; on 2 shared cores it moves these figures a lot).

Reported per mode: turns/s, time to first token (the first streamed text) p50 / p99 over every
turn of every repeat and by turn, the prompt and cached tokens the server counted; and the ratio of
the bound p50 to the stateless p50 (the bar: at most 0.25), overall and per repeat.

``--peer llama-server [--config engine-free|realistic-16|realistic-64] ...``: instead, the chat
fleet against llama-server, the peer a user would pick (``benchmarks.chat_fleet``: its options
follow; ``make peers`` builds the peer once). Writes ``serve-peers-<config>.json`` / ``.png``.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
RATIO_BOUND = 0.25
TEXT_ONLY = "root ::= [a-z ]+"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")


def _words(rng: np.random.Generator, n: int) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return " ".join("".join(rng.choice(list(letters), size=int(rng.integers(1, 3)))) for _ in range(n))


def _turn(client: Any, model: str, messages: list[dict[str, str]], session: str | None,
          reply_tokens: int) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "max_tokens": reply_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "grammar": TEXT_ONLY, "ignore_eos": True}
    headers = {"X-Session-Id": session} if session else {}
    t0 = time.perf_counter()
    ttft, text, usage = None, "", {}
    with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                piece = choice["delta"].get("content")
                if piece:
                    ttft = ttft if ttft is not None else time.perf_counter() - t0
                    text += piece
    return {"ttft_s": ttft, "turn_s": time.perf_counter() - t0, "text": text,
            "prompt_tokens": usage.get("prompt_tokens", 0),
            "cached_tokens": usage.get("prompt_tokens_details", {}).get("cached_tokens", 0),
            "completion_tokens": usage.get("completion_tokens", 0)}


def _history(rng: np.random.Generator, exchanges: int, user_words: int, reply_words: int) -> list[dict[str, str]]:
    """Earlier exchanges of a conversation: user and assistant messages of random words."""
    return [{"role": role, "content": _words(rng, user_words if role == "user" else reply_words)}
            for _ in range(exchanges) for role in ("user", "assistant")]


def run_mode(base: str, model: str, clients: int, turns: int, user_words: int, reply_tokens: int,
             bound: bool, seed: int, history: int = 0) -> dict[str, Any]:
    """``history``: earlier exchanges each conversation starts with (sent with its first turn)."""
    import httpx

    rows: list[list[dict[str, Any]]] = [[] for _ in range(clients)]
    errors: list[str] = []
    start = threading.Barrier(clients)

    def conversation(c: int) -> None:
        rng = np.random.default_rng(seed + c)
        session = f"bench-{uuid.uuid4().hex[:10]}" if bound else None
        messages = _history(rng, history, user_words, reply_tokens)
        try:
            with httpx.Client(base_url=base, timeout=600) as client:
                start.wait(timeout=120)
                for _ in range(turns):
                    messages.append({"role": "user", "content": _words(rng, user_words)})
                    row = _turn(client, model, messages, session, reply_tokens)
                    rows[c].append(row)
                    messages.append({"role": "assistant", "content": row["text"]})
                if session:
                    client.delete(f"/v1/sessions/{session}")
        except Exception as exc:  # reported, and the run fails
            errors.append(f"client {c}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=conversation, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError("; ".join(errors))
    ttfts = [r["ttft_s"] for rs in rows for r in rs if r["ttft_s"] is not None]
    by_turn = [statistics.mean(rs[i]["ttft_s"] for rs in rows if rs[i]["ttft_s"] is not None) for i in range(turns)]
    return {
        "mode": "bound" if bound else "stateless", "clients": clients, "turns": turns, "wall_s": wall,
        "ttft_samples_s": ttfts,
        "turns_per_s": clients * turns / wall, "ttft_p50_s": _percentile(ttfts, 50), "ttft_p99_s": _percentile(ttfts, 99),
        "ttft_by_turn_s": by_turn,
        "prompt_tokens": sum(r["prompt_tokens"] for rs in rows for r in rs),
        "cached_tokens": sum(r["cached_tokens"] for rs in rows for r in rs),
        "prefilled_tokens": sum(r["prompt_tokens"] - r["cached_tokens"] for rs in rows for r in rs),
        "first_prompt_tokens": statistics.mean(rs[0]["prompt_tokens"] for rs in rows),
        "final_conversation_tokens": statistics.mean(rs[-1]["prompt_tokens"] + rs[-1]["completion_tokens"]
                                                     for rs in rows),
    }


def pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode over its repeats: TTFT percentiles over every turn of every repeat, turns/s over
    their summed wall time, the per-turn curve averaged, each repeat's p50 kept."""
    ttfts = [t for r in runs for t in r["ttft_samples_s"]]
    turns = runs[0]["turns"]
    return {
        "mode": runs[0]["mode"], "clients": runs[0]["clients"], "turns": turns, "repeats": len(runs),
        "wall_s": sum(r["wall_s"] for r in runs),
        "turns_per_s": sum(r["clients"] * r["turns"] for r in runs) / sum(r["wall_s"] for r in runs),
        "ttft_p50_s": _percentile(ttfts, 50), "ttft_p99_s": _percentile(ttfts, 99),
        "ttft_p50_by_repeat_s": [r["ttft_p50_s"] for r in runs],
        "ttft_by_turn_s": [statistics.mean(r["ttft_by_turn_s"][i] for r in runs) for i in range(turns)],
        "prompt_tokens": runs[0]["prompt_tokens"], "cached_tokens": runs[0]["cached_tokens"],
        "prefilled_tokens": runs[0]["prefilled_tokens"],
        "first_prompt_tokens": runs[0]["first_prompt_tokens"],
        "final_conversation_tokens": runs[0]["final_conversation_tokens"],
    }


def _serve(model: Path, args: argparse.Namespace, tmp: Path) -> tuple[str, str]:
    import ray
    from ray import serve

    from kvres.cluster import BackendConfig, ColdStoreConfig, KvresConfig, connect
    from kvres.cluster.serve.app import ServeOptions, build

    if ray.is_initialized():
        raise RuntimeError("benchmarks.serve needs a fresh local Ray cluster: ray is already initialised")
    per_session = args.history_tokens + args.conversation_tokens + 2 * args.reply_tokens + 128
    slots = min(64, 2 * args.clients)  # a stateless request's session beside each bound one
    # split: every slot's stream must hold a whole conversation; unified: the budget is what they hold together
    n_ctx = per_session * (slots if args.kv_layout == "split" else args.clients)
    config = KvresConfig(
        backends=[BackendConfig(name="bench", model_path=model, n_ctx=n_ctx, n_seq_max=slots,
                                kv_budget_tokens=per_session * args.clients, n_threads=args.threads,
                                kv_layout=args.kv_layout)],
        cold_store=ColdStoreConfig(ram_budget_bytes=256 << 20, disk_budget_bytes=512 << 20, disk_dir=tmp / "cold"),
    )
    namespace = f"kvres-bench-serve-{uuid.uuid4().hex[:6]}"
    manager = connect(namespace=namespace, config=config, include_dashboard=False, num_cpus=2)
    deadline = time.monotonic() + 300  # the backend's start-up probes run in the background: not during the runs
    while time.monotonic() < deadline and ray.get(manager.backend_handle("bench").stats.remote()).get(
            "recall_costs") == "probing":
        time.sleep(1.0)
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build(ServeOptions(namespace=namespace, config=manager.config, max_replicas=1,
                                 max_ongoing_requests=4 * args.clients)), name="kvres", route_prefix="/")
    return f"http://127.0.0.1:{port}", model.name.removesuffix(".gguf")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    peer = argparse.ArgumentParser(add_help=False)
    peer.add_argument("--peer", choices=("llama-server",), default=None)
    chosen, rest = peer.parse_known_args(argv)
    if chosen.peer:
        from benchmarks.chat_fleet.__main__ import main as chat_fleet

        return chat_fleet(rest, stem="serve-peers")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", choices=("llama-server",), default=None,
                        help="run the chat fleet against this peer instead (benchmarks.chat_fleet; see its --help)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--conversation-tokens", type=int, default=512, help="about what a conversation grows to")
    parser.add_argument("--history-tokens", type=int, default=0,
                        help="about how long each conversation already is before its first turn (a chat resumed)")
    parser.add_argument("--reply-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="runs of both modes, alternating which goes first")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--ff", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--model", type=Path, default=None, help="a GGUF with a chat template instead of writing one")
    parser.add_argument("--kv-layout", choices=("unified", "split"), default="split",
                        help="the backend's llama.cpp KV layout (BackendConfig.kv_layout; split, the default: a "
                             "stream per session, what many resident chat sessions run fastest on)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    if min(args.clients, args.turns, args.reply_tokens, args.repeats) < 1:
        parser.error("--clients, --turns, --reply-tokens and --repeats must be >= 1")
    if args.history_tokens < 0:
        parser.error(f"--history-tokens must be >= 0, got {args.history_tokens}")

    from benchmarks.realistic_model import CHAT_TEMPLATE, ModelShape, write_realistic_model

    shape = ModelShape(args.layers, args.hidden, args.heads, args.kv_heads, args.ff, args.vocab)
    with tempfile.TemporaryDirectory(prefix="kvres-bench-serve-") as folder:
        tmp = Path(folder)
        model = args.model or write_realistic_model(tmp / "realistic-chat.gguf", shape, chat_template=CHAT_TEMPLATE)
        import ray
        from ray import serve

        try:
            base, model_id = _serve(Path(model), args, tmp)
            # one turn warms the replica and measures what the template adds to a turn (headers, BOS / EOS)
            warm = run_mode(base, model_id, 1, 1, 10, args.reply_tokens, False, seed=999)
            overhead = warm["prompt_tokens"] - 10
            per_turn = args.conversation_tokens // args.turns - args.reply_tokens - overhead
            if per_turn < 1:
                raise SystemExit(f"--conversation-tokens {args.conversation_tokens} leaves no room for a user message "
                                 f"in {args.turns} turns of {args.reply_tokens}-token replies ({overhead} tokens of "
                                 "template per turn)")
            # an earlier exchange is about as long as a turn: its user message and its reply
            exchanges = round(args.history_tokens / (per_turn + args.reply_tokens + overhead))
            runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
            for repeat in range(args.repeats):
                # the two modes alternate which goes first, so a drift of the machine's load favours neither
                for bound in ((False, True) if repeat % 2 == 0 else (True, False)):
                    runs[bound].append(run_mode(base, model_id, args.clients, args.turns, per_turn,
                                                args.reply_tokens, bound, seed=repeat, history=exchanges))
                    m = runs[bound][-1]
                    print(f"repeat {repeat + 1} {m['mode']:>9}: {m['turns_per_s']:.2f} turns/s, TTFT p50 "
                          f"{m['ttft_p50_s'] * 1e3:.0f} ms, p99 {m['ttft_p99_s'] * 1e3:.0f} ms; prefilled "
                          f"{m['prefilled_tokens']} tokens, cached {m['cached_tokens']}; first prompts "
                          f"{m['first_prompt_tokens']:.0f} tokens, conversations end at "
                          f"{m['final_conversation_tokens']:.0f} tokens", flush=True)
        finally:
            serve.shutdown()
            ray.shutdown()
    modes = [pooled(runs[False]), pooled(runs[True])]
    stateless, bound_mode = modes
    result = {
        "model": str(args.model) if args.model else "random weights (benchmarks.realistic_model) + CHAT_TEMPLATE",
        "shape": None if args.model else {**shape.__dict__, "n_params": shape.n_params},
        "clients": args.clients, "turns": args.turns, "conversation_tokens": args.conversation_tokens,
        "history_tokens": args.history_tokens,
        "reply_tokens": args.reply_tokens, "user_words_per_turn": per_turn, "template_tokens_per_turn": overhead,
        "threads": args.threads, "kv_layout": args.kv_layout,
        "modes": modes, "ttft_p50_ratio": bound_mode["ttft_p50_s"] / stateless["ttft_p50_s"], "bound": RATIO_BOUND,
        "ttft_p50_ratio_by_repeat": [b / s for b, s in zip(bound_mode["ttft_p50_by_repeat_s"],
                                                          stateless["ttft_p50_by_repeat_s"], strict=True)],
    }
    for m in modes:
        print(f"{m['mode']:>9} over {m['repeats']} repeats: {m['turns_per_s']:.2f} turns/s, TTFT p50 "
              f"{m['ttft_p50_s'] * 1e3:.0f} ms, p99 {m['ttft_p99_s'] * 1e3:.0f} ms")
    print(f"bound / stateless TTFT p50: {result['ttft_p50_ratio']:.3f} (bar: <= {RATIO_BOUND}; by repeat "
          f"{', '.join(f'{r:.3f}' for r in result['ttft_p50_ratio_by_repeat'])})")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serve.json").write_text(json.dumps(result, indent=2))
    _plot(result, args.out / "serve.png")
    return result


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for mode in result["modes"]:
        turns = np.arange(1, len(mode["ttft_by_turn_s"]) + 1)
        left.plot(turns, [t * 1e3 for t in mode["ttft_by_turn_s"]], marker="o", label=mode["mode"])
    left.set_xlabel("turn")
    left.set_ylabel("time to first token, mean over clients (ms)")
    history = f" after {result['history_tokens']}" if result["history_tokens"] else ""
    left.set_title(f"{result['clients']} HTTP clients, {result['conversation_tokens']}-token conversations{history}")
    left.legend()
    names = [m["mode"] for m in result["modes"]]
    x = np.arange(len(names))
    right.bar(x - 0.2, [m["ttft_p50_s"] * 1e3 for m in result["modes"]], 0.4, label="p50")
    right.bar(x + 0.2, [m["ttft_p99_s"] * 1e3 for m in result["modes"]], 0.4, label="p99")
    for i, m in enumerate(result["modes"]):
        right.annotate(f"{m['turns_per_s']:.2f} turns/s", (x[i], m["ttft_p99_s"] * 1e3), ha="center",
                       va="bottom", fontsize="small")
    right.set_xticks(x, names)
    right.set_ylabel("ms")
    right.set_title(f"TTFT p50 bound / stateless = {result['ttft_p50_ratio']:.3f} (bar {result['bound']})")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
