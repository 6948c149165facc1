"""A session asks for its model by a path, and the path it gives need not be the one the backend was
configured with: a symbolic link to the file, the file the link leads to (the HTTP front's catalog
resolves every backend's path), a relative path, the bare file name. Each places the session on a
backend of that file (``kvres.actors.default_model.model_key`` on both sides); a path to another
file is refused naming it. Through ``kvres.cluster`` sessions on a local Ray cluster (backends b0,
b1 and ov run stories260K; pk and chat other models)."""

from __future__ import annotations

import os
import shutil

import pytest

from kvres.policy.placement import PlacementError
from tests.conftest import shared_model_path

STORIES_BACKENDS = {"b0", "b1", "ov"}


def test_every_spelling_of_the_models_path_places_on_its_backends(manager, tmp_path) -> None:
    model = shared_model_path()
    link = tmp_path / "linked-stories.gguf"
    link.symlink_to(model)
    spellings = [link, str(link), model.resolve(), os.path.relpath(model), model.name]
    for spelling in spellings:
        session = manager.open_session(model=spelling)
        try:
            assert session.backend in STORIES_BACKENDS, (spelling, session.backend)
        finally:
            session.close()


def test_a_path_to_another_file_is_refused_naming_it(manager, tmp_path) -> None:
    other = tmp_path / "other-stories.gguf"
    shutil.copyfile(shared_model_path(), other)
    with pytest.raises(PlacementError, match="other-stories.gguf"):
        manager.open_session(model=other)


def test_the_http_fronts_catalog_path_opens_a_session(manager) -> None:
    from kvres.cluster.serve.service import Service

    service = Service(manager.namespace, manager.config)
    try:
        model = service.catalog.of_backend("b0")
        assert model.path == shared_model_path().resolve()
        session, stack = service.stateless(model, None)
        with stack:
            session.append(list(range(3, 13)))
            assert session.backend in STORIES_BACKENDS
    finally:
        service.close()
