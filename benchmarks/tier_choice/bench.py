"""The automatic KV tier choice (T*) on this machine, across contexts and budgets.

Run: ``.venv/bin/python -m benchmarks.tier_choice [--out DIR] [--refresh]``
Writes ``tier_choice.json`` and ``tier_choice.png`` into ``DIR`` (default benchmarks/results).

Primitives: ``probe_machine(model, refresh)``, ``sweep(name, profile_for, head_dims, weights, probes)``,
``recall_table(model, probes)``, ``plot(report, path)``, ``main(argv)``.

What is reported:
- this machine's probes (``kvres.actors.sizing.probes``: host RAM memcpy GB/s, PCIe / device memory where
  a GPU exists, c_engage from the llama.cpp micro-benchmark with its per-tail step times and extra
  cost over the resident step (the zero tail costs nothing extra), prefill
  rate and block import cost on stories260K); the figures are (re)measured and cached as usual,
  env overrides (KVRES_*_GBPS, KVRES_C_ENGAGE_MS) still win;
- for stories260K and the project's default model (models/passkey.gguf when present, else the
  generated tiny default) with this machine's probes, and for a Qwen2.5-14B-shaped KV layout
  (48 layers, 8 KV heads of 128, W_active 14.87 GB: the Q8_0 weights a decode step reads) on this machine and on the two reference hosts
  of docs/policies.md, T* (PCIe 6.7 / RAM 11.5 GB/s and PCIe 51.2 / RAM 9.3 GB/s; their device
  memory bandwidths, 936 and 960 GB/s, are assumed): the decision and all its terms for contexts 256 ..
  131,072 and budgets of 100/98/90/60/30/20% of the f16 KV;
- recall vs recompute of stories260K blocks of 16..256 tokens with the measured costs.
The plot: T* (MiB, after the cliff cap, <= 0 drawn at 0) against context, one line per model/host,
and the tier chosen at a 90% budget.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvres.actors.model_files import active_weight_bytes_of, layout_from_gguf
from kvres.actors.sizing.llama_probes import measure_block_bytes, measure_c_engage
from kvres.actors.sizing.probes import ProbeResults, load_probes
from kvres.actors.sizing.tier_env import tier_config_from_env
from kvres.policy.kv_layout import ModelKVLayout
from kvres.policy.recall import PrefillCost, TierCost, recall_or_recompute
from kvres.policy.tiering import MIB, ProfileFactory, choose_tier, layout_profile_factory

ROOT = Path(__file__).resolve().parents[2]
STORIES = ROOT.parent / "shared" / "models" / "stories260K.gguf"
PASSKEY = ROOT / "models" / "passkey.gguf"
CONTEXTS = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
BUDGET_FRACTIONS = [1.0, 0.98, 0.90, 0.60, 0.30, 0.20]
QWEN14B = ModelKVLayout.uniform(48, 0, 0, n_kv_heads=8, head_dim_k=128, head_dim_v=128)
QWEN14B_WEIGHTS = 14.87e9  # W_active of Qwen2.5-14B Q8_0: the weights a decode step reads (no input embeddings)
REFERENCE_HOSTS = {
    "ref-3090 (pcie 6.7, ram 11.5)": ProbeResults("ref-3090", 11.5, 6.7, 936.0, 0.8),
    "ref-6000 (pcie 51.2, ram 9.3)": ProbeResults("ref-6000", 9.3, 51.2, 960.0, 0.8),
}


def probe_machine(model: Path, refresh: bool) -> tuple[ProbeResults, dict[str, Any]]:
    probes = load_probes(model, refresh=refresh)
    detail = measure_c_engage(model)  # the per-tail figures behind c_engage, for the report
    return probes, {
        "c_engage_s": detail.c_engage_s,
        "n_prompt": detail.n_prompt,
        "tail_tokens": list(detail.tail_tokens),
        "tail_bytes": list(detail.tail_bytes),
        "resident_step_s": detail.resident_step_s,
        "spill_step_s": list(detail.spill_step_s),
        "extra_step_s": list(detail.extra_step_s),
        "tail_gbps": detail.tail_gbps,
    }


def sweep(
    name: str,
    profile_for: ProfileFactory,
    head_dims: tuple[int, int] | None,
    weights: float,
    probes: ProbeResults,
    target_drop: float,
    max_spill_bytes: float,
) -> list[dict[str, Any]]:
    rows = []
    for n_ctx in CONTEXTS:
        f16 = profile_for("f16", "f16").kv_bytes_for_context(n_ctx)
        for frac in BUDGET_FRACTIONS:
            d = choose_tier(
                profile_for, n_ctx, frac * f16, weights_active_bytes=weights, vram_gbps=probes.vram_gbps,
                host_ram_gbps=probes.host_ram_gbps, pcie_gbps=probes.pcie_gbps, c_engage_s=probes.c_engage_s,
                target_drop=target_drop, max_spill_bytes=max_spill_bytes, head_dims=head_dims,
            )
            assert d is not None
            rows.append({"series": name, "budget_fraction": frac, **d.as_dict()})
    return rows


def recall_table(model: Path, probes: ProbeResults) -> list[dict[str, Any]]:
    if probes.import_gbps is None or probes.prefill_tokens_per_s is None:
        return []
    tier = TierCost("ram (measured import)", probes.import_gbps, probes.import_latency_s or 0.0)
    prefill = PrefillCost(probes.prefill_tokens_per_s, probes.prefill_fixed_s or 0.0)
    rows = []
    sizes = (16, 64, 256)
    for n, block_bytes in zip(sizes, measure_block_bytes(model, sizes), strict=True):
        d = recall_or_recompute(block_bytes, n, tier, prefill)
        rows.append({"tokens": n, "block_bytes": block_bytes, "action": d.action,
                     "recall_s": d.recall_s, "recompute_s": d.recompute_s})
    return rows


def _model_series(path: Path, label: str) -> tuple[str, ProfileFactory, tuple[int, int], float]:
    layout = layout_from_gguf(path)
    hk, hv = layout.head_dims
    if hk % 32 or hv % 32:
        label += f" [head_dim {hk}: f16 only]"
    return label, layout_profile_factory(layout), (hk, hv), active_weight_bytes_of(path)


def default_model() -> tuple[Path, str] | None:
    if PASSKEY.is_file():
        return PASSKEY, "passkey.gguf"
    try:
        from kvres.actors.default_model import ensure_tiny_model

        return ensure_tiny_model(), "default tiny (generated)"
    except Exception as exc:  # the benchmark still runs without it
        print(f"default model unavailable: {exc}", file=sys.stderr)
        return None


def run(refresh: bool = False) -> dict[str, Any]:
    if not STORIES.is_file():
        raise SystemExit(f"missing {STORIES}")
    config = tier_config_from_env(os.environ)
    t0 = time.perf_counter()
    probes, c_detail = probe_machine(STORIES, refresh)
    machine = f"this machine ({probes.device})"
    series = [_model_series(STORIES, f"stories260K @ {machine}")]
    dm = default_model()
    if dm is not None:
        series.append(_model_series(dm[0], f"{dm[1]} @ {machine}"))
    rows: list[dict[str, Any]] = []
    for label, factory, dims, weights in series:
        rows += sweep(label, factory, dims, weights, probes, config.target_drop, config.max_spill_bytes)
    rows += sweep(f"qwen2.5-14b layout @ {machine}", QWEN14B.profile, (128, 128), QWEN14B_WEIGHTS, probes,
                  config.target_drop, config.max_spill_bytes)
    for host, ref in REFERENCE_HOSTS.items():
        rows += sweep(f"qwen2.5-14b layout @ {host}", QWEN14B.profile, (128, 128), QWEN14B_WEIGHTS, ref,
                      config.target_drop, config.max_spill_bytes)
    return {
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count()},
        "probes": {"device": probes.device, "host_ram_gbps": probes.host_ram_gbps,
                   "pcie_gbps": probes.pcie_gbps, "vram_gbps": probes.vram_gbps,
                   "bw_eff_gbps": probes.bw_eff_gbps, "link": probes.link, "c_engage_ms": probes.c_engage_ms,
                   "prefill_tokens_per_s": probes.prefill_tokens_per_s, "prefill_fixed_s": probes.prefill_fixed_s,
                   "import_gbps": probes.import_gbps, "import_latency_s": probes.import_latency_s,
                   "sources": dict(probes.sources), "cache_file": probes.cache_file},
        "c_engage_detail": c_detail,
        "config": {"target_drop": config.target_drop, "max_spill_mib": config.max_spill_bytes / MIB},
        "contexts": CONTEXTS,
        "budget_fractions": BUDGET_FRACTIONS,
        "decisions": rows,
        "recall_vs_recompute_stories260K": recall_table(STORIES, probes),
        "elapsed_s": time.perf_counter() - t0,
    }


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    names = list(dict.fromkeys(r["series"] for r in report["decisions"]))
    for i, name in enumerate(names):
        rows = [r for r in report["decisions"] if r["series"] == name and r["budget_fraction"] == 0.90]
        ctx = [r["n_ctx"] for r in rows]
        marker = "osD^v"[i % 5]
        ax.plot(ctx, [max(r["tstar_bytes"], 0.0) / MIB for r in rows], marker=marker, label=name)
        tiers = [r["chosen_index"] + 0.04 * (i - len(names) / 2) for r in rows]  # offset: no hidden lines
        ax2.plot(ctx, tiers, marker=marker, label=name)
    cap = report["config"]["max_spill_mib"]
    ax.axhline(cap, color="grey", ls="--", lw=0.8, label=f"spill cliff cap {cap:.0f} MiB")
    ax.set_xscale("log", base=2)
    ax.set_yscale("symlog", linthresh=0.01)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("T* (MiB, <= 0 shown as 0)")
    ax.set_title(f"T* vs context (target_drop {report['config']['target_drop']:g})")
    ax.legend(fontsize=7)
    ax2.set_xscale("log", base=2)
    ax2.set_yticks([0, 1, 2], ["f16/f16", "q8_0/q8_0", "q4_0/q4_0"])
    ax2.set_xlabel("context (tokens)")
    ax2.set_title("tier chosen at a 90% budget (f16 = 100%)")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _summary(report: dict[str, Any]) -> str:
    p = report["probes"]
    lines = [
        f"probes: host RAM {p['host_ram_gbps']:.2f} GB/s, pcie {p['pcie_gbps']}, vram {p['vram_gbps']:.2f} GB/s, "
        f"bw_eff {p['bw_eff_gbps']:.2f} ({p['link']}), c_engage {p['c_engage_ms']:.4f} ms, "
        f"prefill {p['prefill_tokens_per_s']:.0f} tok/s, import {p['import_gbps']:.2f} GB/s  {p['sources']}",
    ]
    for name in dict.fromkeys(r["series"] for r in report["decisions"]):
        rows = [r for r in report["decisions"] if r["series"] == name and r["budget_fraction"] == 0.90]
        cells = " ".join(
            f"{r['n_ctx']}:{r['chosen']}({'-' if r['tstar_bytes'] <= 0 else format(r['tstar_bytes'] / MIB, '.3g')})"
            for r in rows
        )
        lines.append(f"{name} [90% budget, ctx:tier(T* MiB)] {cells}")
    for r in report["recall_vs_recompute_stories260K"]:
        lines.append(f"recall vs recompute, {r['tokens']} tokens: {r['action']} "
                     f"(recall {r['recall_s'] * 1e6:.1f} us, recompute {r['recompute_s'] * 1e6:.1f} us)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tier_choice", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--refresh", action="store_true", help="re-measure the probes (ignore the cache)")
    args = parser.parse_args(argv)
    report = run(refresh=args.refresh)
    args.out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = args.out / "tier_choice.json", args.out / "tier_choice.png"
    json_path.write_text(json.dumps(report, indent=2, default=lambda o: None if o is None else str(o)))
    plot(report, png_path)
    print(_summary(report))
    print(f"wrote {json_path} and {png_path}")
    return 0 if all(math.isfinite(r["t_resident_s"]) for r in report["decisions"]) else 1
