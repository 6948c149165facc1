"""``kvres serve --model`` on a model of each family kvres documents (docs/models.md): the fixtures of
``kvres.testing.family_models`` (random weights; the public chat template, special tokens and
trained context of Qwen 2.5, Llama 3.1, Mistral v0.3, Gemma 2 and Phi-3), one real server each,
started together.

``/v1/models`` states the context ``model_setup`` derives from the GGUF's ``llama.context_length``
and the ``--kv-memory`` given (so nothing depends on this machine's free memory): the trained
context where that memory holds it (Gemma 2, Phi-3), less where it does not. A chat turn is
rendered with the family's own template: its ``usage.prompt_tokens`` is the token count of that
template rendered here (``kvres.actors.chat_template``) and tokenized with the fixture's own
vocabulary, a count no other family's template gives for the same message.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from kvres.actors.chat_source import ChatTemplateSource, read_chat_template
from kvres.actors.chat_template import ChatTemplateError, render_chat
from kvres.cluster.model_setup import chat_setup
from kvres.testing.family_models import FAMILY_SPECS, write_family_gguf
from tests.conftest import REPO_ROOT

from .conftest import START_TIMEOUT_S, Server, _read_output, free_port, stop_server, wait_healthy
from .test_own_model import _env

KV_MEMORY = "16MiB"
KV_MEMORY_BYTES = 16 << 20
MESSAGES = [{"role": "user", "content": "Name a colour."}]  # no system turn: Gemma 2's template refuses one


@pytest.fixture(scope="module")
def family_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("families")
    return {family: write_family_gguf(family, folder / f"{family}.gguf") for family in FAMILY_SPECS}


@pytest.fixture(scope="module")
def family_servers(family_models: dict[str, Path]) -> Iterator[dict[str, Server]]:
    """One ``kvres serve --model`` per family, started together (a start mostly waits on Ray's)."""
    servers: dict[str, Server] = {}

    def start(family: str) -> None:
        servers[family] = _start(family_models[family])
        wait_healthy(servers[family], timeout_s=START_TIMEOUT_S)

    try:
        with ThreadPoolExecutor(len(family_models)) as pool:
            for started in [pool.submit(start, family) for family in family_models]:
                started.result()
        yield servers
    finally:
        for server in servers.values():
            stop_server(server)


def _prompt_tokens(source: ChatTemplateSource, model: Path) -> int:
    """The messages rendered with ``source``'s template, tokenized as the backend does (the model's
    BOS rule, control tokens parsed) with the vocabulary of ``model``."""
    import llama_cpp

    vocab = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)
    rendered = render_chat(source, MESSAGES)
    return len(vocab.tokenize(rendered.encode(), add_bos=source.add_bos, special=True))


def _start(model: Path) -> Server:
    key = f"test-key-{secrets.token_hex(16)}"
    port = free_port()
    command = [sys.executable, "-m", "kvres.cluster.cli", "serve", "--model", str(model), "--kv-memory", KV_MEMORY,
               "--port", str(port), "--num-cpus", "2", "--min-replicas", "1", "--max-replicas", "1",
               "--namespace", f"kvres-family-{secrets.token_hex(4)}"]
    process = subprocess.Popen(command, cwd=REPO_ROOT, env={**_env(), "KVRES_API_KEYS": key}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", key, model.stem, process)
    ready = threading.Event()
    threading.Thread(target=_read_output, args=(process, server.output, ready), daemon=True).start()
    if not ready.wait(START_TIMEOUT_S) or process.poll() is not None:
        stop_server(server)
        pytest.fail(f"kvres serve --model {model.name} did not start:\n{server.log()}", pytrace=False)
    return server


@pytest.mark.parametrize("family", sorted(FAMILY_SPECS))
def test_kvres_serve_model_of_each_family(family_models: dict[str, Path], family_servers: dict[str, Server],
                                          family: str) -> None:
    model = family_models[family]
    trained = FAMILY_SPECS[family].context_length
    setup = chat_setup(model, kv_memory_bytes=KV_MEMORY_BYTES)
    context = setup.session_context
    assert 64 <= context <= trained
    if family in ("gemma2", "phi3"):  # 8,192 and 4,096 positions: 16 MiB holds 8 streams of them
        assert context == trained
    else:  # 32,768 and 131,072: the memory decides
        assert context < trained and "what the KV memory holds" in setup.summary()

    source = read_chat_template(model)
    assert source is not None and source.template == FAMILY_SPECS[family].template
    expected_prompt = _prompt_tokens(source, model)
    for other, spec in FAMILY_SPECS.items():
        if other == family:
            continue
        with contextlib.suppress(ChatTemplateError):  # a template that refuses the messages is not the one used
            assert _prompt_tokens(replace(source, template=spec.template), model) != expected_prompt, other

    server = family_servers[family]
    log = server.log()
    assert f"kvres serve: chosen for {model.name}:" in log and f"{context:,} tokens per session" in log, log
    assert f"trained on {trained:,} positions, llama.context_length" in log, log
    with server.http() as http:
        cards = http.get("/v1/models").json()["data"]
        assert [(c["id"], c["context_length"], c["trained_context"]) for c in cards] == [
            (family, context, trained)]
        turn = http.post("/v1/chat/completions", json={
            "model": family, "messages": MESSAGES, "max_tokens": 4, "temperature": 0},
            headers={"X-Session-Id": f"family-{family}"})
        assert turn.status_code == 200, turn.text
        body = turn.json()
        usage = body["usage"]
        assert usage["prompt_tokens"] == expected_prompt, (usage, expected_prompt)
        assert 1 <= usage["completion_tokens"] <= 4, usage
        assert body["choices"][0]["finish_reason"] in ("stop", "length"), body
        assert body["kvres"]["prefix_break"] is None, body
