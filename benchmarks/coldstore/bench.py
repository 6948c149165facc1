"""Cold-store throughput against same-run baselines on the same bytes.

Run: ``.venv/bin/python -m benchmarks.coldstore [--out DIR] [--work-dir DIR] [--quick]``
Writes ``coldstore.json`` and ``coldstore.png`` into ``DIR`` (default benchmarks/results) and exits
1 when the acceptance check at 16 MiB fails.

Primitives: ``run_benchmark(sizes, repeats, total_bytes, work_dir) -> dict``, ``acceptance(report)``,
``plot(report, path)``, ``main(argv)``.

Method: for each block size, ``n`` blocks (``total_bytes`` / size, 3..64) are handled ``repeats``
times; each block goes through the baseline and the tier back to back (alternating which goes
first), so both see the same load from whatever else runs on the machine, and throughput is the
block size over the median time per operation.

What is measured, for block sizes 64 KiB .. 64 MiB (MiB/s):
- ``ram``: ``RamTier.put`` / ``get`` as configured by default (the block object is stored as is,
  no encoding), against a numpy copy of the same payload (``arr.copy()``, kept alive like a store
  would keep it).
  Its ratio is large by construction (storing a reference costs no copy).
- ``ram_copy``: ``RamTier(copy_payloads=True)``, which copies a buffer payload once into a private
  buffer (the mode the Ray actor uses), against the same numpy copy: the like-for-like comparison.
- ``disk``: ``DiskTier.put`` with full durability (header encode + payload crc32 + temp file +
  pwritev + fsync + rename + directory fsync, the last one deferred behind the next write, see
  ``kvres.coldstore.fileio``) against a plain sequential ``os.write`` + ``fsync`` of the same
  payload to a new file; ``DiskTier.get`` (read + checksum verify) against a plain ``readinto`` of such a file (both
  from the page cache).
Every row carries ``ratio = tier / baseline``. Acceptance: at 16 MiB, ``ram`` put and ``disk`` put
reach at least 0.5 of their baselines.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kvres.coldstore import BlockKey, DiskTier, KVBlock, KVGeometry, RamTier, make_fingerprint
from kvres.policy.ranges import Range

KIB = 1 << 10
MIB = 1 << 20
SIZES = [64 * KIB, 256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB]
ACCEPT_SIZE = 16 * MIB
ACCEPT_RATIO = 0.5
GEOMETRY = KVGeometry(n_layers=32, n_kv_heads=8, head_dim=128)
FINGERPRINT = make_fingerprint("bench-model", "llama", "f16", "f16", GEOMETRY)


def _blocks(payload: bytes | memoryview, n: int, n_tokens: int = 16) -> list[KVBlock]:
    return [
        KVBlock(
            fingerprint=FINGERPRINT, model_id="bench-model", engine="llama", type_k="f16", type_v="f16",
            geometry=GEOMETRY, session_id="bench", token_range=Range(i * n_tokens, (i + 1) * n_tokens),
            token_ids=tuple(range(n_tokens)), payload=payload, positions=tuple(range(n_tokens)),
        )
        for i in range(n)
    ]


def _paired(
    n: int, repeats: int, setup: Callable[[], Any], base_op: Callable[[Any, int], object],
    tier_op: Callable[[Any, int], object], teardown: Callable[[Any], None] = lambda _: None,
) -> tuple[float, float]:
    """Median seconds per operation of the baseline and of the tier, measured interleaved.

    For each of ``repeats`` rounds (fresh ``setup()``), block i is handled by the baseline and by
    the tier back to back, alternating which goes first, so both see the same machine load
    (other processes share the disk and the cores). The medians drop stray spikes.
    """
    base_times: list[float] = []
    tier_times: list[float] = []
    for r in range(repeats):
        state = setup()
        gc.collect()
        for i in range(n):
            pair = [(base_op, base_times), (tier_op, tier_times)]
            if (i + r) % 2:
                pair.reverse()
            for op, times in pair:
                start = time.perf_counter()
                op(state, i)
                times.append(time.perf_counter() - start)
        teardown(state)
    return statistics.median(base_times), statistics.median(tier_times)


def _write_plain(path: Path, payload: memoryview) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        done = 0
        while done < payload.nbytes:
            done += os.write(fd, payload[done:])
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_plain(path: Path) -> bytearray:
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        buf = bytearray(size)
        view = memoryview(buf)
        done = 0
        while done < size:
            done += f.readinto(view[done:]) or 0
    return buf


def _row(tier: str, op: str, size: int, n: int, repeats: int, seconds: float, baseline: str,
         base_seconds: float) -> dict[str, Any]:
    mib_s = size / MIB / seconds
    base_mib_s = size / MIB / base_seconds
    return {
        "tier": tier, "op": op, "size_bytes": size, "blocks": n, "samples": n * repeats,
        "seconds_per_op": seconds, "mib_s": mib_s, "baseline": baseline,
        "baseline_seconds_per_op": base_seconds, "baseline_mib_s": base_mib_s, "ratio": mib_s / base_mib_s,
    }


def _bench_ram(size: int, n: int, repeats: int, src: np.ndarray) -> list[dict[str, Any]]:
    payload = src.tobytes()
    budget = 4 * n * size + MIB
    rows = []
    # "ram": bytes payloads, stored as they are; "ram_copy": buffer payloads copied once on put.
    for tier, blocks, copy in (("ram", _blocks(payload, n), False),
                               ("ram_copy", _blocks(src.data, n), True)):
        keys = [BlockKey.of(b) for b in blocks]

        def fresh(blocks: list[KVBlock] = blocks, copy: bool = copy, filled: bool = False) -> dict[str, Any]:
            ram = RamTier(budget, copy_payloads=copy)
            if filled:
                for b in blocks:
                    ram.put(b)
            return {"ram": ram, "kept": []}

        def copy_one(state: dict[str, Any], i: int) -> None:
            state["kept"].append(src.copy())  # kept alive, as a store keeps what it copies

        def put_one(state: dict[str, Any], i: int, blocks: list[KVBlock] = blocks) -> None:
            state["ram"].put(blocks[i])

        def get_one(state: dict[str, Any], i: int, keys: list[BlockKey] = keys) -> None:
            state["ram"].get(keys[i])

        base_put, put = _paired(n, repeats, fresh, copy_one, put_one)
        base_get, get = _paired(n, repeats, functools.partial(fresh, filled=True), copy_one, get_one)
        rows.append(_row(tier, "put", size, n, repeats, put, "numpy_copy", base_put))
        rows.append(_row(tier, "get", size, n, repeats, get, "numpy_copy", base_get))
    return rows


def _bench_disk(size: int, n: int, repeats: int, src: np.ndarray, work: Path) -> list[dict[str, Any]]:
    payload = src.tobytes()
    blocks = _blocks(payload, n)
    keys = [BlockKey.of(b) for b in blocks]
    view = memoryview(payload)
    plain_dir = work / "plain"
    tier_dir = work / "tier"

    def fresh() -> DiskTier:
        shutil.rmtree(plain_dir, ignore_errors=True)
        shutil.rmtree(tier_dir, ignore_errors=True)
        plain_dir.mkdir()
        return DiskTier(tier_dir, 4 * n * size + MIB)

    def plain_write(_: DiskTier, i: int) -> None:
        _write_plain(plain_dir / f"{i}.bin", view)

    def tier_put(disk: DiskTier, i: int) -> None:
        disk.put(blocks[i])

    def plain_read(_: DiskTier, i: int) -> None:
        _read_plain(plain_dir / f"{i}.bin")

    def tier_get(disk: DiskTier, i: int) -> None:
        if disk.get(keys[i]) is None:
            raise RuntimeError(f"benchmark block {keys[i]} missing")

    base_put, put = _paired(n, repeats, fresh, plain_write, tier_put, lambda d: d.close())
    disk = fresh()
    for i in range(n):  # both sides' files, written once, read from the page cache
        plain_write(disk, i)
        tier_put(disk, i)
    base_get, get = _paired(n, repeats, lambda: disk, plain_read, tier_get)
    disk.close()
    shutil.rmtree(plain_dir, ignore_errors=True)
    shutil.rmtree(tier_dir, ignore_errors=True)
    return [
        _row("disk", "put", size, n, repeats, put, "write_fsync", base_put),
        _row("disk", "get", size, n, repeats, get, "read", base_get),
    ]


def run_benchmark(
    sizes: Sequence[int] = SIZES, repeats: int = 3, total_bytes: int = 128 * MIB,
    work_dir: str | os.PathLike[str] | None = None, min_blocks: int = 3,
) -> dict[str, Any]:
    """Measure every tier at every size; ``total_bytes`` bounds the bytes moved per measurement."""
    rng = np.random.default_rng(0)
    work = Path(tempfile.mkdtemp(prefix="kvres-coldstore-bench-", dir=work_dir))
    rows: list[dict[str, Any]] = []
    try:
        for size in sizes:
            n = max(min_blocks, min(64, total_bytes // size))
            src = rng.integers(0, 256, size=size, dtype=np.uint8)
            rows += _bench_ram(size, n, repeats, src)
            rows += _bench_disk(size, n, repeats, src, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report: dict[str, Any] = {
        "meta": {
            "python": sys.version.split()[0], "numpy": np.__version__, "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "repeats": repeats, "total_bytes": total_bytes,
            "work_dir": str(work.parent), "unix_time": time.time(),
        },
        "sizes": list(sizes),
        "results": rows,
    }
    report["acceptance"] = acceptance(report)
    return report


def acceptance(report: dict[str, Any]) -> dict[str, Any]:
    """At 16 MiB: ram put and disk put ratios against ``ACCEPT_RATIO`` (None when not measured)."""
    ratios = {
        f"{r['tier']}_{r['op']}_ratio": r["ratio"]
        for r in report["results"] if r["size_bytes"] == ACCEPT_SIZE
    }
    needed = ("ram_put_ratio", "disk_put_ratio")
    passed = None if not all(k in ratios for k in needed) else all(ratios[k] >= ACCEPT_RATIO for k in needed)
    return {"size_bytes": ACCEPT_SIZE, "threshold": ACCEPT_RATIO, "checked": list(needed), **ratios,
            "passed": passed}


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    colors = {"ram": "tab:blue", "ram_copy": "tab:green", "disk": "tab:red"}
    for col, op in enumerate(("put", "get")):
        top, bottom = axes[0][col], axes[1][col]
        for tier, color in colors.items():
            rows = [r for r in report["results"] if r["tier"] == tier and r["op"] == op]
            if not rows:
                continue
            x = [r["size_bytes"] / KIB for r in rows]
            top.plot(x, [r["mib_s"] for r in rows], "o-", color=color, label=f"{tier} {op}")
            top.plot(x, [r["baseline_mib_s"] for r in rows], "x--", color=color, alpha=0.6,
                     label=f"baseline ({rows[0]['baseline']})")
            bottom.plot(x, [r["ratio"] for r in rows], "o-", color=color, label=tier)
        top.set_title(f"{op} throughput (MiB/s)")
        top.set_yscale("log")
        top.legend(fontsize=7)
        bottom.axhline(ACCEPT_RATIO, color="gray", linestyle=":", label="acceptance 0.5")
        bottom.set_yscale("log")
        bottom.set_title(f"{op}: tier / baseline")
        bottom.set_xlabel("block size (KiB)")
        bottom.legend(fontsize=7)
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.grid(True, which="both", alpha=0.3)
    fig.suptitle("kvres cold store vs same-run baselines on the same bytes")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.coldstore", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--work-dir", default=None, help="where the disk tier writes (default: system temp)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--total-mib", type=int, default=128, help="bytes moved per measurement (MiB)")
    parser.add_argument("--sizes-kib", type=int, nargs="*", default=None)
    parser.add_argument("--quick", action="store_true", help="64 and 256 KiB, one repeat (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        sizes, repeats, total, min_blocks = [64 * KIB, 256 * KIB], 1, 1 * MIB, 2
    else:
        sizes = [s * KIB for s in args.sizes_kib] if args.sizes_kib else SIZES
        repeats, total, min_blocks = args.repeats, args.total_mib * MIB, 3
    report = run_benchmark(sizes, repeats, total, args.work_dir, min_blocks)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "coldstore.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.out / "coldstore.png")
    for r in report["results"]:
        print(f"{r['tier']:>8} {r['op']} {r['size_bytes'] // KIB:>6} KiB  {r['mib_s']:>10.0f} MiB/s  "
              f"baseline {r['baseline']:<11} {r['baseline_mib_s']:>10.0f} MiB/s  ratio {r['ratio']:.2f}")
    acc = report["acceptance"]
    print(f"acceptance at 16 MiB (>= {ACCEPT_RATIO}): {acc}")
    print(f"wrote {args.out / 'coldstore.json'} and {args.out / 'coldstore.png'}")
    return 1 if acc["passed"] is False else 0
