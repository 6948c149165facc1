"""``python -m benchmarks.serve`` runs both modes on one server and writes what it promises (a small
model, few clients; no timing assertions)."""

from __future__ import annotations

import json
from pathlib import Path

SMALL = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--ff", "128", "--vocab", "1000"]


def test_serve_benchmark_writes_json_and_png(tmp_path: Path) -> None:
    from benchmarks.serve.__main__ import main

    result = main(["--clients", "2", "--turns", "3", "--conversation-tokens", "240", "--reply-tokens", "6",
                   "--repeats", "1", "--threads", "1", *SMALL, "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "serve.json").read_text())
    assert saved["ttft_p50_ratio"] == result["ttft_p50_ratio"] > 0 and saved["bound"] == 0.25
    stateless, bound = saved["modes"]
    assert (stateless["mode"], bound["mode"]) == ("stateless", "bound")
    assert stateless["cached_tokens"] == 0 and bound["cached_tokens"] > 0
    # bound: every turn after the first prefills only its new tokens; the conversations are the same
    assert bound["prefilled_tokens"] < stateless["prefilled_tokens"]
    assert bound["prompt_tokens"] == stateless["prompt_tokens"]
    assert len(bound["ttft_by_turn_s"]) == 3 and bound["turns_per_s"] > 0
    assert (tmp_path / "serve.png").stat().st_size > 0


def test_conversations_can_start_with_a_history(tmp_path: Path) -> None:
    """``--history-tokens``: each conversation's first turn carries earlier exchanges; a bound
    session prefills them once, a stateless turn every time."""
    from benchmarks.serve.__main__ import main

    result = main(["--clients", "2", "--turns", "2", "--conversation-tokens", "120", "--history-tokens", "150",
                   "--reply-tokens", "6", "--repeats", "1", "--threads", "1", *SMALL, "--out", str(tmp_path)])
    stateless, bound = result["modes"]
    assert result["history_tokens"] == 150
    assert stateless["first_prompt_tokens"] == bound["first_prompt_tokens"] > 150 * 0.6
    assert bound["prefilled_tokens"] < stateless["prefilled_tokens"] - bound["first_prompt_tokens"]
