"""Recall-or-recompute costs of a backend, measured off the call path.

Primitives:
- ``probed_recall_costs(model_path, env=None, disk_dir=None, disk_tier=True, engine=ONE_THREAD_CPU,
  measure=True) -> RecallCosts | None``: the costs of both cold tiers ("ram": re-admitting an
  exported block; "disk": reading it from the disk tier in ``disk_dir``, then re-admitting it) and
  of prefill, from the model's figures (``probes.load_model_figures``, cached per device, model and
  probe engine) and the disk's (``disk_probe.load_disk_read_cost``, cached per file system). None
  without the engine figures; ``measure=False``: None unless every figure is cached (or set by
  the environment).
- ``BackgroundRecallCosts(model_path, engine, disk_folder=None, env=None)``: what a backend
  passes as ``BackendHost(recall_costs=...)``. ``start()`` (when the backend starts) takes the
  cached figures on a background thread, or measures them in a child process
  (``python -m kvres.actors.sizing.recall_probe_worker``) with the backend's own thread count and
  offload, at a lower CPU priority, on the cold store's disk folder (``disk_folder()``: the
  folder, or None where the store has no disk tier). Calling it is an attribute read: None (the
  host reads every block, the default) until the figures arrive. ``status``: "idle", "probing",
  "cached", "measured" or "failed"; ``wait(timeout)``.
- ``recall_costs_to_json(costs)`` / ``recall_costs_from_json(obj)``: what the worker prints.
- ``measure_model_figures(model_path, engine, env=None) -> figures``: the model's own figures T*
  reads (c_engage, prefill, import) measured with ``engine`` in a probe child where not cached
  (``recall_probe_worker --tier``), so a backend's T* probes run with its own thread count and
  offload without a second decoding thread in its process.

The probes run in a child process because only one thread per process may decode with more than
one thread (``kvres.actors.engines.llama.decode_threads``): the backend's step loop is that thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kvres.coldstore import ColdStoreError
from kvres.policy.recall import PrefillCost, RecallCosts, TierCost

from .disk_probe import cached_disk_read_cost, load_disk_read_cost
from .llama_probes import ONE_THREAD_CPU, ProbeEngine
from .probe_common import ProbeError
from .probes import load_model_figures

logger = logging.getLogger("kvres.tiering")

PROBE_TIMEOUT_S = 900.0  # a probe child still running after this is killed; the defaults stay
PROBE_NICE = 10  # the child's niceness: serving keeps the CPU, the probes take what is idle
WORKER_MODULE = "kvres.actors.sizing.recall_probe_worker"


def probed_recall_costs(
    model_path: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    disk_dir: str | os.PathLike[str] | None = None,
    disk_tier: bool = True,
    engine: ProbeEngine = ONE_THREAD_CPU,
    measure: bool = True,
) -> RecallCosts | None:
    """What a cold store needs to decide recall or recompute for the blocks of ``model_path``'s
    backend (``kvres.policy.recall``):

    - "ram": re-admitting an exported block (``measure_import_cost``);
    - "disk" (with ``disk_tier``): reading it from the disk tier in ``disk_dir`` (default: the
      cold store's default folder), then re-admitting it: latencies add, and so do the seconds
      per byte (``1 / bw = 1 / disk_bw + 1 / import_bw``);
    - prefill: ``measure_prefill_cost``.

    None when the engine figures are missing. A disk tier that cannot be probed (an unsafe or
    unwritable folder) is left out, logged: its blocks are then always read."""
    env = os.environ if env is None else env
    figures, _ = load_model_figures(model_path, engine=engine, env=env, c_engage=False, measure=measure)
    if "import_gbps" not in figures or "prefill_tokens_per_s" not in figures:
        return None
    ram = TierCost("ram", figures["import_gbps"], figures.get("import_latency_s", 0.0))
    tiers = {"ram": ram}
    if disk_tier:
        try:
            disk = load_disk_read_cost(disk_dir, env=env) if measure else cached_disk_read_cost(disk_dir, env=env)
        except (ProbeError, ColdStoreError, OSError) as exc:
            logger.warning("disk tier read cost not measured (%s): disk blocks are always read", exc)
        else:
            if disk is None:
                return None  # not cached yet
            tiers["disk"] = TierCost("disk", 1.0 / (1.0 / disk.gbps + 1.0 / ram.bandwidth_gbps),
                                     disk.latency_s + ram.latency_s)
    return RecallCosts(tiers, PrefillCost(figures["prefill_tokens_per_s"], figures.get("prefill_fixed_s", 0.0)))


def recall_costs_to_json(costs: RecallCosts | None) -> dict[str, Any] | None:
    if costs is None:
        return None
    return {"tiers": {name: [t.bandwidth_gbps, t.latency_s] for name, t in costs.tiers.items()},
            "prefill": [costs.prefill.tokens_per_s, costs.prefill.fixed_s]}


def recall_costs_from_json(obj: Any) -> RecallCosts | None:
    """The costs ``recall_costs_to_json`` wrote; a ``ProbeError`` naming what is malformed."""
    if obj is None:
        return None
    try:
        tiers = {str(name): TierCost(str(name), float(bw), float(lat)) for name, (bw, lat) in obj["tiers"].items()}
        rate, fixed = obj["prefill"]
        return RecallCosts(tiers, PrefillCost(float(rate), float(fixed)))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProbeError(f"malformed recall costs from the probe worker: {obj!r:.300} ({exc})") from exc


class BackgroundRecallCosts:
    """A backend's recall costs, measured in the background from ``start()`` on; calling it gives
    the measured ``RecallCosts``, or None until they arrive (or when they could not be measured)."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        engine: ProbeEngine = ONE_THREAD_CPU,
        *,
        disk_folder: Callable[[], str | None] | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float = PROBE_TIMEOUT_S,
    ) -> None:
        self.model_path = os.fspath(model_path)
        self.engine = engine
        self._disk_folder = disk_folder
        self._env = env
        self._timeout_s = timeout_s
        self._costs: RecallCosts | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._child: subprocess.Popen[str] | None = None  # the probe child while it runs
        self._paused = False  # the backend runs calls: the child is stopped
        self.status = "idle"

    def __call__(self) -> RecallCosts | None:
        return self._costs

    def pause(self, paused: bool) -> None:
        """The backend runs calls (True) or has none left (False): the probe child is stopped
        meanwhile (SIGSTOP, then SIGCONT), so a decode never shares its cores with a probe. Its
        medians and best-of figures take the pauses; its timeout keeps counting."""
        with self._lock:
            self._paused = paused
            self._signal_child()

    def _signal_child(self) -> None:
        proc = self._child
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGSTOP if self._paused else signal.SIGCONT)

    def _started(self, proc: subprocess.Popen[str] | None) -> None:
        with self._lock:
            self._child = proc
            if self._paused:
                self._signal_child()

    def start(self) -> None:
        """Begin (once): the cached figures, else a probe child; returns at once."""
        with self._lock:
            if self._thread is not None:
                return
            self.status = "probing"
            self._thread = threading.Thread(target=self._run, name="kvres-recall-probe", daemon=True)
            self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the probing finished (successfully or not) within ``timeout`` seconds."""
        return self._done.wait(timeout)

    def _run(self) -> None:
        try:
            disk_dir, disk_tier = self._disk_tier()
            costs = probed_recall_costs(self.model_path, env=self._env, disk_dir=disk_dir, disk_tier=disk_tier,
                                        engine=self.engine, measure=False)
            status = "cached"
            if costs is None:
                costs, status = self._measure(disk_dir, disk_tier), "measured"
            if costs is None:
                raise ProbeError("the probe worker measured no engine figures")
            self._costs, self.status = costs, status
            logger.info("recall costs of %s (%s): %s", self.model_path, status, recall_costs_to_json(costs))
        except Exception as exc:  # the backend keeps serving: it reads every block
            self.status = "failed"
            logger.warning("recall costs of %s not measured (%s): every cold block is read", self.model_path, exc)
        finally:
            self._done.set()

    def _disk_tier(self) -> tuple[str | None, bool]:
        """(folder, whether there is a disk tier); a folder nobody can name leaves the tier out."""
        if self._disk_folder is None:
            return None, True
        try:
            folder = self._disk_folder()
        except Exception as exc:
            logger.warning("the cold store's disk folder is unknown (%s): disk blocks are always read", exc)
            return None, False
        return folder, folder is not None

    def _measure(self, disk_dir: str | None, disk_tier: bool) -> RecallCosts | None:
        extra = ["--disk-dir", disk_dir] if disk_dir is not None else [] if disk_tier else ["--no-disk"]
        obj = _run_worker(self.model_path, self.engine, [*extra, "--nice", str(PROBE_NICE)], self._env,
                          self._timeout_s, started=self._started)
        return recall_costs_from_json(obj)


def measure_model_figures(
    model_path: str | os.PathLike[str], engine: ProbeEngine, env: Mapping[str, str] | None = None,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> dict[str, float]:
    """The model's own figures with ``engine`` (prefill, import and, unless the environment sets it,
    c_engage), measured where missing in a probe child and cached (``probes.load_model_figures``):
    what T* reads afterwards with ``load_probes(..., engine=engine)``. A child, because a backend
    process decodes with more than one thread only on its step loop's thread."""
    obj = _run_worker(os.fspath(model_path), engine, ["--tier"], env, timeout_s)
    if not isinstance(obj, dict):
        raise ProbeError(f"the probe worker printed {obj!r:.200} instead of the model's figures")
    return {str(k): float(v) for k, v in obj.items()}


def _run_worker(model_path: str, engine: ProbeEngine, extra: list[str], env: Mapping[str, str] | None,
                timeout_s: float, started: Callable[[subprocess.Popen[str] | None], None] | None = None) -> Any:
    """Run the probe worker for ``model_path`` with ``engine``; its last line of JSON.
    ``started``: told the child process once it runs, and None once it has ended."""
    cmd = [sys.executable, "-m", WORKER_MODULE, model_path, "--threads", str(engine.n_threads),
           "--gpu-layers", str(engine.n_gpu_layers), *extra]
    if engine.main_gpu is not None:
        cmd += ["--main-gpu", str(engine.main_gpu)]
    child_env = None if env is None or env is os.environ else {**os.environ, **env}
    proc = subprocess.Popen(cmd, env=child_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        if started is not None:
            started(proc)
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        proc.kill()  # stopped or not
        proc.communicate()
        raise ProbeError(f"the probe worker ran past {timeout_s:.0f} s and was killed") from exc
    finally:
        if started is not None:
            started(None)
    if proc.returncode != 0:
        raise ProbeError(f"the probe worker exited with {proc.returncode}: {err.strip()[-800:]}")
    lines = out.strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError as exc:
        raise ProbeError(f"the probe worker printed no JSON: {out.strip()[-300:]!r}") from exc
