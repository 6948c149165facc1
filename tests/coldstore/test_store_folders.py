"""Store folders: private (0700) and checked, never trusted; the default one in the user's cache;
orphans collected; ``destroy`` leaves nothing of kvres's behind."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kvres.actors.ray_actors.coldstore_actor import ColdStoreServer, default_store_dir
from kvres.coldstore import BlockKey, DiskTier, UnsafeStoreDirError, new_secret, private_dir

from .helpers import make_block, payload_of

MIB = 1 << 20


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_missing_folders_are_created_0700(tmp_path: Path) -> None:
    folder = private_dir(tmp_path / "a" / "b" / "store")
    assert _mode(folder) == _mode(folder.parent) == _mode(folder.parent.parent) == 0o700
    with DiskTier(tmp_path / "fresh", MIB) as disk:
        disk.put(make_block(b"kv"))
        assert {_mode(p) for p in [tmp_path / "fresh", *(tmp_path / "fresh").rglob("*")]
                if p.is_dir()} == {0o700}


def test_a_symlinked_folder_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = private_dir(tmp_path / "elsewhere")
    (tmp_path / "store").symlink_to(target)
    with pytest.raises(UnsafeStoreDirError, match="symbolic link") as info:
        DiskTier(tmp_path / "store", MIB)
    assert info.value.path == str(tmp_path / "store") and str(tmp_path / "store") in str(info.value)
    assert list(target.iterdir()) == []


@pytest.mark.parametrize("mode", [0o777, 0o750, 0o701])
def test_a_folder_open_to_group_or_others_is_refused_not_repaired(tmp_path: Path, mode: int) -> None:
    folder = tmp_path / "store"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(UnsafeStoreDirError, match=f"mode is {mode:#o}.*group or others") as info:
        DiskTier(folder, MIB)
    assert isinstance(info.value, ValueError)
    assert _mode(folder) == mode and list(folder.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)
    with pytest.raises(UnsafeStoreDirError, match="owned by uid 65534"):
        DiskTier(folder, MIB)


def test_a_folder_inside_one_others_can_change_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UnsafeStoreDirError, match="writable by group or others without the sticky bit"):
        DiskTier(shared / "store", MIB)
    shared.chmod(0o1777)  # sticky, like /tmp: nobody else can rename our folder away
    DiskTier(shared / "store", MIB).close()


def test_a_file_where_the_folder_should_be_is_refused(tmp_path: Path) -> None:
    (tmp_path / "store").write_bytes(b"")
    with pytest.raises(UnsafeStoreDirError, match="not a directory"):
        DiskTier(tmp_path / "store", MIB)


def test_default_folder_is_in_the_private_user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = default_store_dir("ns-kvres-coldstore-0123")
    assert folder == tmp_path / "cache" / "kvres" / "coldstore" / "ns-kvres-coldstore-0123"
    assert _mode(folder) == _mode(folder.parent) == _mode(folder.parent.parent) == 0o700
    for bad in ("", "..", "../x", "a/b"):
        with pytest.raises(UnsafeStoreDirError):
            default_store_dir(bad)
    server = ColdStoreServer(0, None, 4 * MIB, cache_folder="ns-node", secret=new_secret())
    block = make_block(payload_of(1024), session_id="s1")
    server.put(block)
    assert server.tier_of(BlockKey.of(block)) == "disk"
    assert list((tmp_path / "cache" / "kvres" / "coldstore" / "ns-node" / "blocks" / "s1").iterdir())
    assert server.destroy() == 1
    assert not (tmp_path / "cache" / "kvres" / "coldstore" / "ns-node").exists()


def test_destroy_removes_every_block_and_the_folder_but_nothing_foreign(tmp_path: Path) -> None:
    server = ColdStoreServer(4096, tmp_path / "store", 4 * MIB, secret=new_secret())
    blocks = [make_block(payload_of(3000, seed=i), session_id=f"s{i % 3}", start=8 * i) for i in range(9)]
    server.put_many(blocks)
    stats = server.stats()
    assert stats["ram_blocks"] > 0 and stats["disk_blocks"] > 0
    assert server.destroy() == 9
    assert not (tmp_path / "store").exists()
    kept = ColdStoreServer(0, tmp_path / "other", 4 * MIB)
    kept.put(blocks[0])
    (tmp_path / "other" / "notes.txt").write_text("not kvres's")
    assert kept.destroy() == 1
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["notes.txt"]


def test_orphans_are_collected_live_and_recent_sessions_kept(tmp_path: Path) -> None:
    server = ColdStoreServer(8192, tmp_path / "store", 4 * MIB, secret=new_secret())
    for i, sid in enumerate(["live", "closed-1", "closed-2", "live", "closed-1"]):
        server.put(make_block(payload_of(3000, seed=i), session_id=sid, start=8 * i))
    assert server.session_ids() == ["closed-1", "closed-2", "live"]
    assert server.collect_orphans(["live"]) == {}  # all put just now: maybe opened after the directory
    assert server.collect_orphans(["live"], min_idle_s=0) == {"closed-1": 2, "closed-2": 1}
    assert server.session_ids() == ["live"] and len(server.list_session("live")) == 2
    server.close()
    reopened = ColdStoreServer(8192, tmp_path / "store", 4 * MIB)  # nothing put since start-up
    on_disk = len(reopened.list_session("live"))  # what had spilled: RAM ended with the process
    assert on_disk >= 1 and reopened.collect_orphans([]) == {"live": on_disk}
    assert reopened.session_ids() == []
    reopened.close()
