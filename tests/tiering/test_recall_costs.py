"""The disk tier's read cost, recall costs from the probes, and a backend measuring them off its
call path (a probe child process, then the cache)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest

from kvres.actors.sizing import disk_probe
from kvres.actors.sizing.llama_probes import ProbeEngine
from kvres.actors.sizing.probe_cache import cache_path, model_key
from kvres.actors.sizing.probe_common import ProbeError
from kvres.actors.sizing.probes import load_probes
from kvres.actors.sizing.recall_costs import (
    BackgroundRecallCosts,
    probed_recall_costs,
    recall_costs_from_json,
    recall_costs_to_json,
)
from kvres.actors.sizing.recall_probe_worker import main as worker_main
from kvres.actors.sizing.tier_env import EnvValueError

WAIT_S = 300.0  # a bound on a stuck probe child, not a timing check


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"KVRES_CACHE_DIR": str(tmp_path), **extra}


def test_disk_read_cost_of_a_real_disk_tier(tmp_path: Path) -> None:
    """Blocks written by a real DiskTier, dropped from the page cache, read back and decoded."""
    gbps, latency = disk_probe.measure_disk_read_cost(tmp_path, block_bytes=(16 << 10, 256 << 10), repeats=2)
    assert np.isfinite(gbps) and gbps > 0 and np.isfinite(latency) and latency >= 0
    assert list(tmp_path.iterdir()) == []  # the probe's tier is gone
    with pytest.raises(ProbeError, match="repeats >= 1"):
        disk_probe.measure_disk_read_cost(tmp_path, repeats=0)


def test_disk_read_cost_cached_per_file_system_and_env_overridable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(disk_probe, "measure_disk_read_cost", lambda d: calls.append(d) or (0.8, 2e-4))
    env = _env(tmp_path / "cache")
    first = disk_probe.load_disk_read_cost(tmp_path, env=env)
    assert (first.gbps, first.latency_s, first.sources["gbps"]) == (0.8, 2e-4, "measured")
    again = disk_probe.load_disk_read_cost(tmp_path, env=env)
    assert (again.gbps, again.sources["latency_s"]) == (0.8, "cached") and calls == [tmp_path]
    assert "disk" in json.loads(Path(cache_path(env)).read_text())
    pinned = disk_probe.load_disk_read_cost(tmp_path, env={**env, "KVRES_DISK_READ_GBPS": "0.2",
                                                       "KVRES_DISK_LATENCY_MS": "15"})
    assert (pinned.gbps, pinned.latency_s, dict(pinned.sources)) == (0.2, 0.015, {"gbps": "env", "latency_s": "env"})
    with pytest.raises(EnvValueError, match="KVRES_DISK_READ_GBPS"):
        disk_probe.load_disk_read_cost(tmp_path, env={**env, "KVRES_DISK_READ_GBPS": "0"})
    assert load_probes(env={**env, "KVRES_HOST_RAM_GBPS": "10"}, engine_probes=False)  # shares the file
    assert disk_probe.load_disk_read_cost(tmp_path, env=env).sources["gbps"] == "cached" and len(calls) == 1


def _spilled_store(tmp_path: Path):
    """Six 64 KiB blocks of one session, the three oldest spilled from RAM to the disk tier."""
    from kvres.coldstore import BlockKey, TieredStore
    from tests.coldstore.helpers import make_block, payload_of

    blocks = [make_block(payload_of(64 << 10, i), start=16 * i, n_tokens=16) for i in range(6)]
    store = TieredStore.open(3 * (64 << 10) + 8192, tmp_path / "disk", 1 << 22)
    for block in blocks:
        store.put(block)
    keys = [BlockKey.of(b) for b in blocks]
    return store, keys, [b.payload_nbytes for b in blocks]


def test_probed_recall_costs_price_both_tiers_and_a_slow_disk_is_recomputed(
    stories_model: Path, tmp_path: Path
) -> None:
    """probed_recall_costs gives "ram" and "disk"; pop_many reads a block only where its tier's
    cost beats recomputing its tokens, so with a slow disk the disk blocks come back None (the
    backend recomputes them) and are removed unread, while RAM blocks are read."""
    env = _env(tmp_path / "cache", KVRES_HOST_RAM_GBPS="11.5", KVRES_C_ENGAGE_MS="0.1")
    measured = probed_recall_costs(stories_model, env=env, disk_dir=tmp_path)
    assert measured is not None and set(measured.tiers) == {"ram", "disk"}
    disk, ram = measured.tiers["disk"], measured.tiers["ram"]
    assert 0 < disk.bandwidth_gbps < ram.bandwidth_gbps and disk.latency_s >= ram.latency_s

    slow = probed_recall_costs(stories_model, disk_dir=tmp_path, env={
        **env, "KVRES_DISK_READ_GBPS": "0.001", "KVRES_DISK_LATENCY_MS": "1000"})
    fast = probed_recall_costs(stories_model, disk_dir=tmp_path, env={
        **env, "KVRES_DISK_READ_GBPS": "1000", "KVRES_DISK_LATENCY_MS": "0"})
    assert slow is not None and fast is not None
    for costs, disk_read in ((slow, False), (fast, True)):
        store, keys, nbytes = _spilled_store(tmp_path / f"store-{disk_read}")
        tiers = store.tiers(keys)
        assert tiers.count("disk") == 3 and tiers.count("ram") == 3
        worth = [costs.worth_reading(n, 16, t or "") for n, t in zip(nbytes, tiers, strict=True)]
        assert all(w == disk_read for w, t in zip(worth, tiers, strict=True) if t == "disk")
        got = store.pop_many(keys, nbytes, costs)
        assert [b is not None for b in got] == worth
        assert not any(k in store for k in keys)  # read or not, every popped block is gone
        store.close()


def test_cached_only_costs_need_every_figure(stories_model: Path, tmp_path: Path) -> None:
    """``measure=False`` measures nothing: None until the model's and the disk's figures are cached."""
    env = _env(tmp_path / "cache")
    assert probed_recall_costs(stories_model, env=env, disk_dir=tmp_path, measure=False) is None
    assert not (tmp_path / "cache").exists()
    assert probed_recall_costs(stories_model, env=env, disk_tier=False) is not None  # model figures now cached
    assert probed_recall_costs(stories_model, env=env, disk_dir=tmp_path, measure=False) is None  # disk is not
    assert set(probed_recall_costs(stories_model, env=env, disk_tier=False, measure=False).tiers) == {"ram"}


def test_recall_costs_json_round_trip_and_malformed_input_is_named() -> None:
    from kvres.policy.recall import PrefillCost, RecallCosts, TierCost

    costs = RecallCosts({"ram": TierCost("ram", 5.0, 1e-4), "disk": TierCost("disk", 0.5, 2e-4)},
                        PrefillCost(900.0, 0.01))
    back = recall_costs_from_json(json.loads(json.dumps(recall_costs_to_json(costs))))
    assert back is not None and dict(back.tiers) == dict(costs.tiers) and back.prefill == costs.prefill
    assert recall_costs_from_json(None) is None
    with pytest.raises(ProbeError, match="malformed recall costs"):
        recall_costs_from_json({"tiers": {"ram": [1.0]}, "prefill": [1.0, 0.0]})


def test_worker_prints_the_costs_it_measured(stories_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KVRES_CACHE_DIR", str(tmp_path / "cache"))
    assert worker_main([str(stories_model), "--threads", "2", "--no-disk"]) == 0
    costs = recall_costs_from_json(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert costs is not None and set(costs.tiers) == {"ram"} and costs.prefill.tokens_per_s > 0
    models = json.loads(cache_path({"KVRES_CACHE_DIR": str(tmp_path / "cache")}).read_text())["models"]
    assert list(models) == [model_key(stories_model, ProbeEngine(2))]
    assert worker_main([str(tmp_path / "missing.gguf"), "--no-disk"]) == 1
    assert "missing.gguf" in capsys.readouterr().err


def test_a_backend_measures_in_a_child_then_takes_the_cache(stories_model: Path, tmp_path: Path) -> None:
    """Until start() nothing is known (None: the host reads every block). The first backend on a
    fresh cache measures in a child process with its own engine settings; the next one takes the
    cached figures without measuring."""
    env = _env(tmp_path / "cache")
    disk = tmp_path / "disk"
    disk.mkdir()
    first = BackgroundRecallCosts(stories_model, ProbeEngine(2), disk_folder=lambda: str(disk), env=env)
    assert first() is None and first.status == "idle" and not first.wait(0)
    first.start()
    first.start()  # once
    assert first.wait(WAIT_S) and first.status == "measured"
    costs = first()
    assert costs is not None and set(costs.tiers) == {"ram", "disk"} and costs.prefill.tokens_per_s > 0
    assert list(disk.iterdir()) == []  # the disk probe's folder is gone
    data = json.loads(cache_path(env).read_text())
    assert list(data["models"]) == [model_key(stories_model, ProbeEngine(2))] and len(data["disk"]) == 1
    second = BackgroundRecallCosts(stories_model, ProbeEngine(2), disk_folder=lambda: str(disk), env=env)
    second.start()
    assert second.wait(WAIT_S) and second.status == "cached" and second() == costs
    no_disk = BackgroundRecallCosts(stories_model, ProbeEngine(2), disk_folder=lambda: None, env=env)
    no_disk.start()
    assert no_disk.wait(WAIT_S) and no_disk.status == "cached"
    assert no_disk() is not None and set(no_disk().tiers) == {"ram"}  # type: ignore[union-attr]

    def store_gone() -> str | None:
        raise RuntimeError("no cold store answers")

    unknown = BackgroundRecallCosts(stories_model, ProbeEngine(2), disk_folder=store_gone, env=env)
    unknown.start()  # the disk tier is left out (its blocks are always read), the rest is known
    assert unknown.wait(WAIT_S) and unknown.status == "cached" and unknown() == no_disk()


def test_a_probe_that_fails_leaves_the_defaults(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A model llama.cpp cannot load: the child exits 1, the warning names the model, the host keeps
    reading every block (None)."""
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"GGUF" + bytes(64))
    probe = BackgroundRecallCosts(bogus, disk_folder=lambda: None, env=_env(tmp_path / "cache"))
    with caplog.at_level(logging.WARNING, logger="kvres.tiering"):
        probe.start()
        assert probe.wait(WAIT_S)
    assert probe.status == "failed" and probe() is None
    assert "bogus.gguf" in caplog.text and "probe worker exited with 1" in caplog.text


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_the_probe_child_is_stopped_while_the_backend_runs_calls(stories_model: Path, tmp_path: Path) -> None:
    """``pause(True)`` (the backend's step loop took up calls) stops the child (SIGSTOP), so no
    decode shares its cores with a probe; ``pause(False)`` lets it go on, and it measures as it
    would have. A child that starts while the backend is busy starts stopped."""
    probe = BackgroundRecallCosts(stories_model, ProbeEngine(1), disk_folder=lambda: None,
                                  env=_env(tmp_path / "cache"))
    probe.pause(True)  # busy before the child exists
    probe.start()
    deadline = time.monotonic() + 60
    while probe._child is None and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.01)
    child = probe._child  # type: ignore[attr-defined]
    assert child is not None
    time.sleep(0.3)
    assert _state(child.pid) == "T" and not probe.wait(0)  # stopped from the start
    probe.pause(False)
    time.sleep(0.3)
    assert child.poll() is not None or _state(child.pid) != "T"
    probe.pause(True)
    probe.pause(False)
    assert probe.wait(WAIT_S) and probe.status == "measured" and probe() is not None
    assert probe._child is None  # type: ignore[attr-defined]
    probe.pause(True)  # nothing left to stop: a no-op
