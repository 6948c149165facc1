"""One's own GGUF in one command: ``kvres serve --model`` and ``kvres chat --model``, no JSON.

The context comes from the model's trained context (GGUF ``<arch>.context_length``) and the KV
memory; ``/v1/models`` states it; every choice is printed at start; a wrong path, a file that is
not a GGUF and a model without a chat template are one line each, exit 2, before anything starts.
Models: the project's chat model (trained on 512 positions), a copy of it whose metadata claims a
32,768-token trained context, the passkey model and stories260K (no chat template).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kvres.actors.default_model import CHAT_MODEL, PASSKEY_MODEL
from kvres.cluster.model_setup import ModelChoiceError, chat_setup
from kvres.cluster.serve.catalog import ModelCatalog
from tests.conftest import REPO_ROOT, shared_model_path

from .conftest import START_TIMEOUT_S, Server, _read_output, free_port, stop_server, wait_healthy

LONG_CONTEXT = 32768


@pytest.fixture(scope="module")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chat model with ``llama.context_length`` rewritten to 32,768 in place (same size)."""
    from gguf import GGUFReader

    path = tmp_path_factory.mktemp("long") / "long-chat.gguf"
    shutil.copyfile(CHAT_MODEL, path)
    reader = GGUFReader(str(path), "r+")
    reader.fields["llama.context_length"].parts[-1][0] = LONG_CONTEXT
    del reader
    return path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "KVRES_CONFIG", "KVRES_API_KEY_FILE")}
    return {**env, "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def test_the_context_is_the_trained_one_where_the_memory_holds_it(long_model: Path) -> None:
    setup = chat_setup(long_model, kv_memory_bytes=1 << 30)
    backend = setup.config.backends[0]
    assert setup.session_context == LONG_CONTEXT  # not the fixed 2,048 default
    assert (backend.kv_layout, backend.n_seq_max, backend.n_ctx) == ("split", 8, 8 * LONG_CONTEXT)
    assert setup.config.default_policy.kind == "none"
    card = ModelCatalog(setup.config.backends).models[0].card()
    assert (card["context_length"], card["trained_context"]) == (LONG_CONTEXT, LONG_CONTEXT)
    summary = setup.summary("kvres serve")
    assert "trained on 32,768 positions" in summary and "32,768 tokens per session" in summary
    for what in ("model", "device", "KV memory", "threads", "context", "layout", "policy"):
        assert f"  {what} " in summary, summary


def test_less_memory_buys_a_shorter_context_and_the_catalog_says_so(long_model: Path) -> None:
    small = chat_setup(long_model, kv_memory_bytes=64 << 20)
    assert 64 <= small.session_context < LONG_CONTEXT
    assert ModelCatalog(small.config.backends).models[0].card()["context_length"] == small.session_context
    assert "what the KV memory holds" in small.summary()
    with pytest.raises(ModelChoiceError, match="--kv-memory"):
        chat_setup(long_model, kv_memory_bytes=4096)


def test_a_sliding_window_model_runs_unified_each_session_capped_at_its_context(tmp_path: Path) -> None:
    from tests.capacity.arch_models import ARCH_MODELS, write_arch_model

    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    gemma2 = write_arch_model(ARCH_MODELS["gemma2"], tmp_path / "gemma2.gguf", chat_template=template)
    setup = chat_setup(gemma2, kv_memory_bytes=64 << 20)
    backend = setup.config.backends[0]
    assert backend.kv_layout == "unified" and backend.kv_budget_tokens == setup.session_context
    assert backend.n_ctx == setup.session_context * backend.n_seq_max
    card = ModelCatalog(setup.config.backends).models[0].card()
    assert card["context_length"] == setup.session_context
    assert "unified: the model has a sliding window" in setup.summary("kvres serve")


def test_a_model_trained_on_fewer_positions_gets_those() -> None:
    setup = chat_setup(CHAT_MODEL)  # trained on 512: the free memory holds far more
    assert setup.session_context == 512
    assert ModelCatalog(setup.config.backends).models[0].card()["context_length"] == 512


def test_threads_are_the_backends_default_unless_given(long_model: Path) -> None:
    default = chat_setup(long_model, kv_memory_bytes=64 << 20)
    assert default.config.backends[0].n_threads is None
    assert "the backend's machine's cores, at most 4 (--threads sets it)" in default.summary()
    three = chat_setup(long_model, kv_memory_bytes=64 << 20, n_threads=3)
    assert three.config.backends[0].n_threads == 3 and "3 engine threads (--threads)" in three.summary()
    for bad in (0, -2, 257):
        with pytest.raises(ModelChoiceError, match=rf"--threads must be in 1\.\.256 .*got {bad}$"):
            chat_setup(long_model, kv_memory_bytes=64 << 20, n_threads=bad)


@pytest.mark.parametrize("command", ["serve", "chat", "start"])
def test_threads_out_of_range_or_without_a_model_is_one_line(command: str) -> None:
    """Out of range: a usage error of --model's (exit 2); beside --config: as --kv-memory there (exit 1)."""
    cases = [(["--model", str(CHAT_MODEL), "--threads", "0"], 2,
              "--threads must be in 1..256 (the engine's CPU threads), got 0")]
    if command != "chat":  # kvres chat takes no --config: without --model it chats with the project's model
        cases.append((["--config", "{}", "--threads", "2"], 1, "--threads goes with --model"))
    for args, code, what in cases:
        out = subprocess.run([sys.executable, "-m", "kvres.cluster.cli", command, *args],
                             capture_output=True, text=True, timeout=120, env=_env(), cwd=REPO_ROOT, input="")
        assert out.returncode == code, (args, out.stdout, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and what in lines[0] and "Traceback" not in out.stderr, (args, out.stderr)


@pytest.mark.parametrize("command", ["serve", "chat", "start"])
def test_a_model_that_cannot_be_served_is_one_line_and_exit_2(command: str, tmp_path: Path) -> None:
    not_gguf = tmp_path / "weights.safetensors"
    not_gguf.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    cases = {
        str(tmp_path / "missing.gguf"): "no such file",
        str(not_gguf): "is not a GGUF file",
        str(PASSKEY_MODEL): "has no chat template",
        str(shared_model_path()): "has no chat template",
        str(tmp_path): "is a folder",
    }
    for model, what in cases.items():
        out = subprocess.run([sys.executable, "-m", "kvres.cluster.cli", command, "--model", model],
                             capture_output=True, text=True, timeout=120, env=_env(), cwd=REPO_ROOT, input="")
        assert out.returncode == 2, (model, out.stdout, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and what in lines[0] and "Traceback" not in out.stderr, (model, out.stderr)
        assert lines[0].startswith(f"kvres {command}: --model {model!r}"), lines[0]


def test_kvres_chat_on_ones_own_model_prints_its_choices_and_answers(long_model: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvres.cluster.cli", "chat", "--model", str(long_model), "--kv-memory", "64MiB",
         "--threads", "1", "--max-tokens", "24"],
        input="hello\nwhat is 2 plus 3?\n", capture_output=True, text=True, timeout=300, env=_env(), cwd=REPO_ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    expected = chat_setup(long_model, kv_memory_bytes=64 << 20).session_context
    assert "kvres chat: chosen for long-chat.gguf:" in out.stderr
    assert f"{expected:,} tokens per session" in out.stderr and "1 engine thread (--threads)" in out.stderr, out.stderr
    lines = out.stdout.splitlines()
    asked = [i for i, line in enumerate(lines) if line.startswith("> ")]
    assert [lines[i] for i in asked] == ["> hello", "> what is 2 plus 3?"], out.stdout
    assert all(lines[i + 1].strip() for i in asked if i + 1 < len(lines)) and asked[-1] + 1 < len(lines), out.stdout


def test_kvres_serve_model_states_its_context_and_chats(long_model: Path, tmp_path: Path) -> None:
    key = f"test-key-{secrets.token_hex(16)}"
    port = free_port()
    env = {**_env(), "KVRES_API_KEYS": key}
    command = [sys.executable, "-m", "kvres.cluster.cli", "serve", "--model", str(CHAT_MODEL), "--port", str(port),
               "--threads", "2", "--num-cpus", "2", "--min-replicas", "1", "--max-replicas", "1",
               "--namespace", f"kvres-own-model-{secrets.token_hex(4)}"]
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", key, "chat", process)
    ready = threading.Event()
    threading.Thread(target=_read_output, args=(process, server.output, ready), daemon=True).start()
    try:
        if not ready.wait(START_TIMEOUT_S) or process.poll() is not None:
            pytest.fail(f"kvres serve --model did not start:\n{server.log()}", pytrace=False)
        wait_healthy(server)
        log = server.log()
        assert "kvres serve: chosen for chat.gguf:" in log and "512 tokens per session" in log, log
        assert "2 engine threads (--threads)" in log, log
        with server.http() as http:
            cards = http.get("/v1/models").json()["data"]
            assert [(c["id"], c["context_length"], c["trained_context"]) for c in cards] == [("chat", 512, 512)]
            turn = http.post("/v1/chat/completions", json={
                "model": "chat", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16,
                "temperature": 0}, headers={"X-Session-Id": "own-model"})
            assert turn.status_code == 200, turn.text
            assert turn.json()["choices"][0]["message"]["content"].strip()
            long = " ".join(["the cat sat on the mat"] * 120)  # past the 512 tokens the session can hold
            refused = http.post("/v1/chat/completions", json={
                "model": "chat", "messages": [{"role": "user", "content": long}], "max_tokens": 4},
                headers={"X-Session-Id": "own-model-long"})
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert error["code"] == "context_length_exceeded" and "past the 512 tokens" in error["message"], error
            assert "X-Session-Id" in error["message"] and "kvres serve" in error["message"], error
    finally:
        stop_server(server)
