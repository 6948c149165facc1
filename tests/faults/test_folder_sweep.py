"""The store folders an earlier run left (their owning process gone) are removed beside a new
store's folder; those of a process still running, of another namespace, or without a marker stay.
Real processes: each folder is claimed by a Python process of its own."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

CLAIM = "import sys; from kvres.actors.ray_actors.store_folders import claim; claim(sys.argv[1], 'n-' + sys.argv[1][-4:])"


def _folder(root: Path, name: str, sessions: list[str]) -> Path:
    folder = root / name
    for sid in sessions:
        (folder / "blocks" / sid).mkdir(parents=True)
        (folder / "blocks" / sid / "0-16.fp.kvb").write_bytes(b"x")
    return folder


def test_folders_of_dead_owners_of_the_namespace_are_swept_and_named(tmp_path) -> None:
    from kvres.actors.ray_actors.store_folders import claim, sweep_siblings

    prefix = "ns-kvres-coldstore-"
    own = _folder(tmp_path, prefix + "aaaa", ["mine"])
    claim(own, "n-aaaa")  # this process: alive
    dead = _folder(tmp_path, prefix + "bbbb", ["s1", "s2"])
    subprocess.run([sys.executable, "-c", CLAIM, str(dead)], check=True)  # its owner has exited
    other_ns = _folder(tmp_path, "other-kvres-coldstore-cccc", ["s3"])
    subprocess.run([sys.executable, "-c", CLAIM, str(other_ns)], check=True)
    unmarked = _folder(tmp_path, prefix + "dddd", ["s4"])
    removed = tmp_path / (prefix + "ffff")  # its store removed it; the marker stayed
    removed.mkdir()
    subprocess.run([sys.executable, "-c", CLAIM, str(removed)], check=True)
    removed.rmdir()
    live = _folder(tmp_path, prefix + "eeee", ["s5"])
    sleeper = subprocess.Popen([sys.executable, "-c", CLAIM + "; import time; time.sleep(60)", str(live)])
    try:
        for _ in range(3000):  # its claim lands within a second or so
            if live.with_name(live.name + ".owner").exists():
                break
            time.sleep(0.01)
        swept = sweep_siblings(own, prefix)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert [(s["folder"], s["sessions"], s["node"]) for s in swept] == [(dead.name, ["s1", "s2"], "n-bbbb")]
    assert not dead.exists() and not dead.with_name(dead.name + ".owner").exists()
    assert own.exists() and other_ns.exists() and unmarked.exists() and live.exists()
    assert not removed.with_name(removed.name + ".owner").exists()  # cleaned up, not reported
    assert sweep_siblings(own, prefix) != []  # the sleeper has exited now: its folder goes too
    assert not live.exists()
