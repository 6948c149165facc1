"""Fixtures of the llama.cpp backend tests: executors on stories260K with one thread each."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvres.actors.engines.llama import LlamaExecutor

from .tiny_gguf import write_quantizable_model

STORY = (
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
    "with her friends. One day, she saw a big red ball under a tree. She ran to get it, but a dog "
    "took it first. Tom had a toy car. He liked to drive it around the house. His mom said, \"Be "
    "careful, Tom!\" But Tom did not listen. The car hit the table and a cup fell down. There was a "
    "big bear in the forest. The bear was very hungry. He looked for food all day. He found some "
    "honey in a tree, but the bees were angry."
)


@pytest.fixture(scope="session")
def quant_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Llama GGUF with head_dim 32, so q8_0 / q4_0 KV caches are possible."""
    return write_quantizable_model(tmp_path_factory.mktemp("models") / "tiny-hd32.gguf")


@pytest.fixture
def make_llama(stories_model: Path) -> Iterator[Callable[..., LlamaExecutor]]:
    """Factory of fresh executors (closed after the test); keyword arguments override defaults
    (``model=`` picks another model file)."""
    made: list[LlamaExecutor] = []

    def make(model: Path | None = None, **options: Any) -> LlamaExecutor:
        kwargs: dict[str, Any] = {"n_ctx": 1024, "n_seq_max": 4, "n_threads": 1}
        kwargs.update(options)
        executor = LlamaExecutor(model or stories_model, **kwargs)
        made.append(executor)
        return executor

    yield make
    for executor in made:
        executor.close()


@pytest.fixture
def llama(make_llama: Callable[..., LlamaExecutor]) -> LlamaExecutor:
    return make_llama()


def story_tokens(executor: LlamaExecutor, n: int, variant: int = 0) -> list[int]:
    """``n`` tokens of story text (repeated as needed), rotated by ``variant`` sentences."""
    sentences = STORY.split(". ")
    text = ". ".join(sentences[variant:] + sentences[:variant])
    tokens = executor.tokenize(text)
    while len(tokens) < n:
        tokens += executor.tokenize(" " + text, add_bos=False)
    return tokens[:n]


