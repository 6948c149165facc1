"""``kvres capacity MODEL.gguf [--memory 8GiB] [--context N] [--json] [--probe]``: what a model's KV
costs and how much context a memory holds.

Primitives:
- ``register(subparsers)`` / ``run(args) -> int``: the command (``kvres.cluster.cli`` registers it).
- ``parse_bytes(text) -> int``: "8GiB", "512 MiB", "2GB", "1e9", "4096" (bytes; units as
  ``pydantic.ByteSize`` reads them, plain numbers also in scientific notation); a typed
  ``CapacityError`` otherwise.
- ``capacity_report(model, memory_bytes=None, context=None, probes=None) -> dict``: the layout
  (global / windowed / shared / recurrent layers, window, where the pattern came from), bytes per
  token, and per KV tier (f16, q8_0, q4_0) the context that fits the memory: with windowed layers
  billed their window (T0), billed dense, and as llama.cpp allocates a one-sequence context with
  a small SWA cache (window + micro-batch, padded) or its default full-size one; the SWA saving;
  the T* decision with its terms (``kvres.policy.tiering.choose_tier``). The model's trained
  context (GGUF ``<arch>.context_length``) caps what a backend can use: ``usable_context`` per tier
  and ``warnings`` say so where the memory holds more, or ``--context`` asks for more.
- ``format_table(report) -> str``: the device (llama.cpp's first GPU, ``report["gpu"]``, or that
  there is none: the decode then reads host RAM, and the terms say so), the table, then the tier
  choice and T* in plain words (what spills, and how much KV may spill before each token slows by
  more than the target), then the terms, then the warnings.

Without ``--memory`` the memory is the free memory of llama.cpp's first GPU, else host RAM. The T*
terms come from ``kvres.actors.sizing.probes.load_probes`` (cached per device, env overrides); only
``--probe`` runs the llama.cpp micro-benchmarks on the model (c_engage, ...), otherwise c_engage is
the documented default unless cached.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pydantic import ByteSize, TypeAdapter, ValidationError

from kvres.policy.capacity import CapacityError, LayerKVProfile, resolve_context_for_budget
from kvres.policy.kv_layout import CacheCells, ModelKVLayout
from kvres.policy.tiering import KV_TIER_LADDER, MIB, choose_tier, layout_profile_factory, tier_supported

MAX_CONTEXT = 1 << 24
_BYTE_SIZE = TypeAdapter(ByteSize)


def parse_bytes(text: str) -> int:
    try:
        value = float(text)  # a plain number of bytes, also 1e9
    except ValueError:
        try:
            value = float(_BYTE_SIZE.validate_python(text.strip()))
        except ValidationError:
            raise CapacityError(f"memory {text!r} is not a size: expected a number with an optional unit "
                                f"(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)") from None
    if value < 1:
        raise CapacityError(f"memory {text!r} must be at least 1 byte")
    return int(value)


def _fits(profile: LayerKVProfile, budget: float) -> int:
    return resolve_context_for_budget(profile, budget, max_context=MAX_CONTEXT)


def _llama_fits(layout: ModelKVLayout, k: str, v: str, budget: float, cells: CacheCells) -> int:
    """The largest context (a multiple of llama.cpp's 256-cell padding) whose allocation fits."""
    fits = _fits(layout.profile(k, v, cells), budget)
    return fits - fits % cells.pad


def _gpu() -> str | None:
    """llama.cpp's first GPU, named; None on a machine without one."""
    from kvres.actors.sizing.device_memory import llama_gpu_memory

    gpu = llama_gpu_memory(0)
    return None if gpu is None else f"{gpu.name} ({gpu.description})"


def _default_memory() -> tuple[int, str]:
    from kvres.actors.sizing.device_memory import host_memory, llama_gpu_memory

    gpu = llama_gpu_memory(0)
    memory = gpu or host_memory()
    return memory.free_bytes, f"free {memory.name} memory ({memory.description})"


def capacity_report(
    model: Path, memory_bytes: int | None = None, context: int | None = None, probes: Any = None,
) -> dict[str, Any]:
    from kvres.actors.model_files import active_weight_bytes_of, layout_from_gguf, read_gguf_metadata

    layout = layout_from_gguf(model)
    meta = read_gguf_metadata(model)
    trained = int(meta.get(f"{layout.arch}.context_length") or 0)
    if memory_bytes is None:
        memory_bytes, memory_source = _default_memory()
    else:
        memory_source = "--memory"
    n_ctx = context or trained or 4096
    small_swa, full_swa = CacheCells(n_seq_max=1, swa_full=False), CacheCells(n_seq_max=1)
    head_k, head_v = layout.head_dims
    tiers = []
    for tier in KV_TIER_LADDER:
        k, v = tier.type_k, tier.type_v
        windowed = layout.profile(k, v)
        row: dict[str, Any] = {
            "tier": tier.name, "supported": tier_supported(tier, head_k, head_v),
            "bytes_per_token_dense": windowed.dense_kv_bytes_for_context(1),
            "bytes_per_token_growth": windowed.marginal_kv_bytes_per_token(),
            "kv_bytes_at_context": windowed.kv_bytes_for_context(n_ctx),
            "dense_kv_bytes_at_context": windowed.dense_kv_bytes_for_context(n_ctx),
            "fits_windowed": _fits(windowed, memory_bytes),
            "fits_dense": int(memory_bytes // windowed.dense_kv_bytes_for_context(1)),
            "fits_llama_cpp": _llama_fits(layout, k, v, memory_bytes, small_swa),
            "fits_llama_cpp_full_swa": _llama_fits(layout, k, v, memory_bytes, full_swa),
        }
        row["swa_saving"] = 1.0 - row["kv_bytes_at_context"] / row["dense_kv_bytes_at_context"]
        row["usable_context"] = min(row["fits_llama_cpp"], trained) if trained else row["fits_llama_cpp"]
        tiers.append(row)
    if probes is None:
        from kvres.actors.sizing.probes import load_probes

        probes = load_probes(None)
    weights = active_weight_bytes_of(model)
    decision = choose_tier(
        layout_profile_factory(layout), n_ctx, float(memory_bytes), weights_active_bytes=weights,
        vram_gbps=probes.vram_gbps, host_ram_gbps=probes.host_ram_gbps, pcie_gbps=probes.pcie_gbps,
        c_engage_s=probes.c_engage_s, head_dims=(head_k, head_v),
    )
    assert decision is not None
    return {
        "model": str(model),
        "layout": {
            "arch": layout.arch, "blocks": layout.n_layer, "kv_layers": len(layout.layers),
            "global_layers": layout.global_layers, "windowed_layers": layout.windowed_layers,
            "window": layout.window, "chunked": layout.chunked, "shared_layers": layout.shared_layers,
            "recurrent_layers": layout.recurrent_layers, "pattern": layout.source,
            "head_dims": [head_k, head_v], "trained_context": trained,
        },
        "gpu": _gpu(),
        "memory_bytes": memory_bytes,
        "memory_source": memory_source,
        "context": n_ctx,
        "weights_active_bytes": weights,
        "tiers": tiers,
        "tstar": decision.as_dict(),
        "tstar_summary": decision.summary(),
        "probe_sources": dict(getattr(probes, "sources", {})),
        "warnings": _warnings(layout.arch, trained, n_ctx, context, tiers),
    }


def _warnings(arch: str, trained: int, n_ctx: int, asked: int | None, tiers: list[dict[str, Any]]) -> list[str]:
    """Where the trained context caps what the memory holds, or what --context asks."""
    if not trained:
        return [f"the model file names no trained context ({arch}.context_length): the figures are the "
                "memory's alone; check the model card for how many positions it was trained on"]
    out = []
    most = max((t for t in tiers if t["supported"]), key=lambda t: t["fits_llama_cpp"], default=None)
    if most is not None and most["fits_llama_cpp"] > trained:
        out.append(f"the model was trained on {trained:,} positions ({arch}.context_length): the memory holds "
                   f"{most['fits_llama_cpp']:,} tokens of {most['tier']} KV, but a context past {trained:,} is "
                   f"outside its training and its output degrades there; a backend uses at most {trained:,} "
                   "(the usable column)")
    if asked is not None and n_ctx > trained:
        out.append(f"--context {n_ctx} is past the {trained:,} positions the model was trained on")
    return out


def _mib(n: float) -> str:
    return f"{n / MIB:,.1f} MiB"


def format_table(report: dict[str, Any]) -> str:
    lay = report["layout"]
    lines = [
        f"model      {report['model']}",
        f"layout     {lay['arch']}: {lay['blocks']} blocks, {lay['kv_layers']} with KV "
        f"({lay['global_layers']} global, {lay['windowed_layers']} windowed"
        + (f" of {lay['window']} tokens{', chunked' if lay['chunked'] else ''}" if lay["window"] else "")
        + f"; {lay['shared_layers']} share KV, {lay['recurrent_layers']} recurrent); pattern: {lay['pattern']}",
        f"heads      K {lay['head_dims'][0]}, V {lay['head_dims'][1]}; trained context {lay['trained_context']:,}",
        f"memory     {_mib(report['memory_bytes'])} ({report['memory_source']}); context {report['context']:,}",
        f"device     {report['gpu']}" if report.get("gpu") else
        "device     no GPU (llama.cpp sees only the CPU): weights and KV are read from host RAM",
        "",
        f"{'tier':<10} {'B/token':>9} {'KV @ ctx':>14} {'dense @ ctx':>14} {'SWA saves':>9} "
        f"{'fits (T0)':>12} {'fits dense':>12} {'llama.cpp':>12} {'full SWA':>12} {'usable':>12}",
    ]
    for row in report["tiers"]:
        if not row["supported"]:
            lines.append(f"{row['tier']:<10} (head dims are not whole {row['tier'].split('/')[0]} blocks: "
                         "llama.cpp cannot build it)")
            continue
        lines.append(
            f"{row['tier']:<10} {row['bytes_per_token_growth']:>9,.0f} {_mib(row['kv_bytes_at_context']):>14} "
            f"{_mib(row['dense_kv_bytes_at_context']):>14} {row['swa_saving']:>9.1%} {row['fits_windowed']:>12,} "
            f"{row['fits_dense']:>12,} {row['fits_llama_cpp']:>12,} {row['fits_llama_cpp_full_swa']:>12,} "
            f"{row['usable_context']:>12,}"
        )
    lines += ["", *_tier_in_words(report["tstar"], gpu=bool(report.get("gpu"))), ""]
    lines.append("fits (T0): windowed layers billed their window; llama.cpp: one sequence, SWA cache of window + "
                 "512-token micro-batch, 256-cell padding; full SWA: llama.cpp's default swa_full; usable: "
                 "llama.cpp's, capped at the trained context")
    lines += [f"warning    {w}" for w in report.get("warnings", [])]
    return "\n".join(lines)


def _tier_in_words(d: dict[str, Any], gpu: bool = True) -> list[str]:
    """The T* choice as sentences: which KV tier, whether anything spills and what that costs.
    Without a GPU the decode reads host RAM, and the terms say so instead of naming a VRAM."""
    pcie = "none" if d["pcie_gbps"] is None else f"{d['pcie_gbps']:.2f}"
    target = f"{d['target_drop']:.0%}"
    kv_top = d["kv_bytes"][0]
    if d["chosen_spill_bytes"] <= 0:
        what = f"the whole KV cache ({_mib(d['kv_bytes'][d['chosen_index']])}) fits in memory: nothing spills"
    else:
        what = (f"{_mib(d['chosen_spill_bytes'])} of its KV does not fit and spills to host memory, predicted "
                f"to slow each token by {d['predicted_drop']:.0%}"
                + (" (more than the target: no tier fits, the smallest is taken)" if d["floor_fallback"] else ""))
    if d["tstar_bytes"] <= 0:
        tstar = (f"none: engaging the spill path alone ({d['c_engage_s'] * 1e3:.3f} ms) costs more than {target} "
                 f"of a token's time ({d['t_resident_s'] * 1e3:.3f} ms), so spilling is never worth it here")
    else:
        tstar = (f"up to {_mib(d['tstar_bytes'])} may spill before each token slows by more than {target}"
                 + (f" (capped at {_mib(d['max_spill_bytes'])})" if d["tstar_bytes"] >= d["max_spill_bytes"] else ""))
    top = "" if d["chosen_index"] == 0 else f" ({d['ladder'][0]} needs {_mib(kv_top)}: a smaller tier is taken)"
    return [
        f"KV tier    {d['chosen']} for {d['n_ctx']:,} tokens in {_mib(d['budget_bytes'])}{top}: {what}",
        f"T*         how much KV may spill to host memory: {tstar}",
        f"terms      t_resident {d['t_resident_s'] * 1e3:.3f} ms = (W_active {_mib(d['weights_active_bytes'])} + "
        f"KV {_mib(d['kv_resident_bytes'])}) / {'vram' if gpu else 'host RAM (no GPU)'} {d['vram_gbps']:.1f} GB/s; bw_eff {d['bw_eff_gbps']:.2f} GB/s "
        f"({d['binding_link']}; host RAM {d['host_ram_gbps']:.2f}, pcie {pcie}); c_engage "
        f"{d['c_engage_s'] * 1e3:.3f} ms",
    ]


def register(subparsers: Any) -> None:
    cmd = subparsers.add_parser("capacity", help="a model's KV layout and the context a memory holds")
    cmd.add_argument("model", type=Path, help="a GGUF model file")
    cmd.add_argument("--memory", default=None, help="KV memory, e.g. 8GiB (default: free GPU or host memory)")
    cmd.add_argument("--context", type=int, default=None, help="context for the T* choice (default: trained)")
    cmd.add_argument("--json", action="store_true", help="print JSON instead of a table")
    cmd.add_argument("--probe", action="store_true", help="run the llama.cpp probes on the model for T*")
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvres.actors.sizing.probes import load_probes

    memory = None if args.memory is None else parse_bytes(args.memory)
    if args.context is not None and args.context < 1:
        raise CapacityError(f"--context must be >= 1, got {args.context}")
    probes = load_probes(args.model if args.probe else None)
    report = capacity_report(args.model, memory, args.context, probes)
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0
