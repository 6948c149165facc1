"""A session written to a file and loaded on another backend of the same model continues as the
original would. Through kvres.cluster sessions on a local Ray cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvres.cluster import SessionPolicy
from kvres.coldstore import BlockAuthError

PROMPT = list(range(3, 203))


@pytest.mark.parametrize("policy", [SessionPolicy(), SessionPolicy.streaming(96, recent_tokens=32)],
                         ids=["none", "streaming"])
def test_export_on_one_backend_restore_on_another_continues_identically(manager, tmp_path: Path, policy) -> None:
    with manager.open_session(backend="b0", policy=policy) as s:
        s.append(PROMPT)
        s.generate(20, ignore_eos=True)
        path = s.export(tmp_path / "s.kvres")
        expected = s.generate(32, ignore_eos=True)  # the original runs on after the export
    restored = manager.restore(path, session_id="restored-" + policy.kind, backend="b1")
    with restored:
        assert restored.backend == "b1"
        assert restored.stats()["policy"] == policy.model_dump()
        assert restored.stats()["counters"]["recomputed_tokens"] == 0  # its KV came with it
        assert restored.generate(32, ignore_eos=True) == expected


def test_a_session_file_restores_on_another_engine_by_recomputing(manager, tmp_path: Path) -> None:
    with manager.open_session(backend="b0") as s:
        s.append(PROMPT[:80])
        path = s.export(tmp_path / "cross.kvres")
    with manager.restore(path, session_id="on-openvino", backend="ov") as moved:
        assert moved.tokens() == PROMPT[:80]
        assert moved.stats()["counters"]["recomputed_tokens"] == 80
        assert len(moved.generate(8, ignore_eos=True)) == 8


def test_an_altered_session_file_is_refused(manager, tmp_path: Path) -> None:
    with manager.open_session(backend="b0") as s:
        s.append(PROMPT[:40])
        path = s.export(tmp_path / "tampered.kvres")
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(BlockAuthError, match="altered"):
        manager.restore(path, session_id="tampered", backend="b1")
    assert "tampered" not in {x.session_id for x in manager.sessions()}
