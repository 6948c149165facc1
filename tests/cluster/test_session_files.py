"""What the API fuzz (tests/cluster/test_fuzz_api.py, ``make fuzz``) found, each case pinned: a path
that names no file to write or read is a ``SessionFileError`` (a ``KvresError`` and an ``OSError``)
naming it, with nothing written and the session as it was; a model or backend of the wrong type is
refused before the planner hears of it; a JSON schema the grammar converter cannot express is a
``GrammarError``; a restore under an open session's id leaves that session where it is. On a local Ray
cluster with the real llama engine (stories260K)."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvres.actors.sampling import GrammarError
from kvres.cluster import SessionFileError
from kvres.policy import ArgumentError, KvresError, SessionExistsError

PROMPT = list(range(3, 43))


@pytest.fixture(scope="module")
def session(manager: Any) -> Iterator[Any]:
    with manager.open_session(backend="b0") as s:
        s.append(PROMPT)
        yield s


def _files(*folders: Path) -> dict[Path, list[str]]:
    return {folder: sorted(os.listdir(folder)) for folder in folders}


def _unwritable_folder(tmp_path: Path) -> Path:
    """A folder this user cannot create a file in: a read-only one, or (root writes there anyway)
    ``/sys``, which refuses even root."""
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    for folder in (read_only, Path("/sys")):
        probe = folder / f".probe-{uuid.uuid4().hex[:8]}"
        try:
            probe.touch()
        except OSError:
            return folder
        probe.unlink()
    pytest.skip("no folder refuses this user a new file (not root's /sys either)")


def _export_refused(session: Any, path: object, *folders: Path) -> SessionFileError:
    before, files = session.tokens(), _files(*folders)
    with pytest.raises(SessionFileError) as caught:
        session.export(path)
    assert isinstance(caught.value, KvresError) and isinstance(caught.value, OSError)
    assert repr(os.fspath(path)) in str(caught.value) or repr(str(path)) in str(caught.value), str(caught.value)
    assert _files(*folders) == files, f"export({path!r}) left a file behind"
    assert session.tokens() == before
    return caught.value


@pytest.mark.parametrize("path", ["", ".", "..", "/", "sub/..", "folder/"])
def test_export_to_a_path_that_names_no_file_is_refused_naming_it(session: Any, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "folder").mkdir()
    error = _export_refused(session, path, tmp_path, tmp_path / "sub", tmp_path / "folder")
    assert "directory" in str(error)


def test_export_to_an_existing_directory_is_refused_naming_it(session: Any, tmp_path: Path) -> None:
    folder = tmp_path / "exports"
    folder.mkdir()
    for path in (folder, str(folder)):
        assert "is a directory" in str(_export_refused(session, path, tmp_path, folder))


def test_export_into_a_missing_folder_or_under_a_file_is_refused_naming_it(session: Any, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_bytes(b"x")
    assert "does not exist" in str(_export_refused(session, tmp_path / "missing" / "s.kvsession", tmp_path))
    assert "is not a directory" in str(_export_refused(session, tmp_path / "a-file" / "s.kvsession", tmp_path))


def test_export_into_an_unwritable_folder_is_refused_naming_it(session: Any, tmp_path: Path) -> None:
    folder = _unwritable_folder(tmp_path)
    _export_refused(session, folder / "s.kvsession", folder)


def test_export_to_a_name_with_a_nul_character_is_refused_naming_it(session: Any, tmp_path: Path) -> None:
    _export_refused(session, str(tmp_path / "s\0.kvsession"), tmp_path)


def test_after_refused_exports_the_session_exports_and_restores_whole(manager: Any, session: Any,
                                                                    tmp_path: Path) -> None:
    for path in ("", tmp_path, tmp_path / "missing" / "s.kvsession"):
        with pytest.raises(SessionFileError):
            session.export(path)
    written = session.export(tmp_path / "s.kvsession")
    assert sorted(os.listdir(tmp_path)) == ["s.kvsession"]  # no temporary file beside it
    with manager.restore(written, session_id=f"r-{uuid.uuid4().hex[:8]}", backend="b1") as restored:
        assert restored.tokens() == session.tokens()


@pytest.mark.parametrize("name", ["", ".", "folder", "missing.kvsession", "s\0.kvsession"])
def test_restore_from_a_path_that_names_no_readable_file_is_refused_naming_it(
        manager: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    sessions = manager.planner_client.directory()
    with pytest.raises(SessionFileError, match=re.escape(f"path {name!r}")):
        manager.restore(name, session_id="never-restored")
    assert manager.planner_client.directory() == sessions


@pytest.mark.parametrize("path", [None, 5, b"s.kvsession", ["s.kvsession"]])
def test_restore_from_a_path_of_the_wrong_type_is_refused_naming_it(manager: Any, path: object) -> None:
    with pytest.raises(ArgumentError, match="path must be a str or a path"):
        manager.restore(path, session_id="never-restored")


def test_a_model_of_the_wrong_type_is_refused_before_placement(manager: Any, session: Any, tmp_path: Path) -> None:
    exported = session.export(tmp_path / "s.kvsession")
    sessions = manager.planner_client.directory()
    for model in (False, 7, ["m.gguf"]):
        with pytest.raises(ArgumentError, match="model must be"):
            manager.open_session(model=model, session_id="never-opened")
        with pytest.raises(ArgumentError, match="model must be"):
            manager.restore(exported, session_id="never-restored", model=model)
    assert manager.planner_client.directory() == sessions


def test_restore_onto_a_backend_of_the_wrong_type_or_name_registers_nothing(manager: Any, session: Any,
                                                                           tmp_path: Path) -> None:
    exported = session.export(tmp_path / "s.kvsession")
    sessions = manager.planner_client.directory()
    with pytest.raises(ArgumentError, match="backend name is a str"):
        manager.restore(exported, session_id="never-restored", backend=False)
    with pytest.raises(KvresError, match="unknown backend 'nope'"):
        manager.restore(exported, session_id="never-restored", backend="nope")
    assert manager.planner_client.directory() == sessions


def test_restore_under_an_open_sessions_id_leaves_that_session_where_it_is(manager: Any, session: Any,
                                                                           tmp_path: Path) -> None:
    exported = session.export(tmp_path / "s.kvsession")
    tokens = session.tokens()
    for backend in ("b0", "b1", None):
        with pytest.raises(SessionExistsError, match=session.session_id):
            manager.restore(exported, session_id=session.session_id, backend=backend)
        assert manager.planner_client.where(session.session_id) == "b0"
    assert manager.session(session.session_id).tokens() == tokens


def test_a_json_schema_the_converter_cannot_express_is_a_grammar_error(session: Any) -> None:
    before = session.tokens()
    with pytest.raises(GrammarError, match="json_schema cannot be turned into a grammar"):
        session.generate(2, json_schema={"": 24570})
    assert session.tokens() == before
