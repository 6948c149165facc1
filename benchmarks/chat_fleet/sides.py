"""The two servers of a chat-fleet run, on the same GGUF: ``kvres serve`` and llama-server.

Primitives:
- ``with_chat_template(source, target, template) -> Path``: a copy of a GGUF with ``template`` as
  its ``tokenizer.chat_template`` (the shared stories260K model has none; both servers' chat routes
  need one).
- ``prepare_model(kind, folder, model=None, shape=None) -> Path``: the run's GGUF: ``model`` as it
  is when it has a chat template (else a copy with ``CHAT_TEMPLATE``), ``"stories260K"`` the
  shared model with ``CHAT_TEMPLATE``, ``"realistic"`` ``benchmarks.realistic_model``'s random
  weights of ``shape`` (default ``REALISTIC``) with it.
- ``ChatModel(path)``: the model's tokenizer (``count(text)``) and its chat template rendered the
  way the servers render it (``render(messages)``, with the generation prompt), in this process.
- ``Side(name, base_url, root_pid, model_id, bound)``: what the driver talks to; ``bound``: each
  conversation's turns carry its ``X-Session-Id`` (kvres), else the whole history is the prompt and
  ``cache_prompt`` asks the server to reuse what a slot or its RAM cache holds (llama-server).
- ``fleet_backend(model, w, tokens_per_conversation, threads, kv_layout) -> BackendConfig``: the
  one backend kvres runs the fleet on (``KvresServe``'s, and the host side's).
- ``KvresServe(model, w, tokens_per_conversation, threads, kv_layout, cold_ram_bytes, folder)``:
  ``kvres serve`` in a process of its own (an embedded Ray cluster, one backend with ``w.slots``
  sequence slots and a KV budget of ``w.slots`` conversations, one Serve replica), started on a
  free port (a second try where it exits while starting) and stopped (SIGTERM; whatever of its tree is left, killed); ``side()``.
- ``llama_server_flags(w, tokens_per_conversation, threads, cache_ram_mib) -> list[str]``: ``-np``
  slots, unified KV of as many conversations as kvres's budget, ``--cache-ram``, the threads, the
  GGUF's template through Jinja (``--jinja``); ``peer_side(server)``: a started ``LlamaServer`` as a
  ``Side``; ``model_id_of(base_url)``: the first model ``/v1/models`` lists.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from benchmarks.peers import LlamaServer, PeerStartError, free_port

from .proc_cpu import read_stat, tree_pids
from .workload import ChatWorkload, Message

ROOT = Path(__file__).resolve().parents[2]
SHARED_MODEL = ROOT.parent / "shared" / "models" / "stories260K.gguf"
START_TIMEOUT_S = 600.0


def with_chat_template(source: Path, target: Path, template: str) -> Path:
    import gguf

    reader = gguf.GGUFReader(str(source))
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    if arch is None:
        raise ValueError(f"{source} names no architecture")
    writer = gguf.GGUFWriter(str(target), arch=str(arch.contents()), endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith(("GGUF.", "tokenizer.chat_template")):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    writer.add_chat_template(template)
    for tensor in reader.tensors:
        writer.add_tensor_info(tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes,
                               tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(tensor.data)
    writer.close()
    return target


def _has_chat_template(path: Path) -> bool:
    import gguf

    return gguf.GGUFReader(str(path)).get_field(gguf.Keys.Tokenizer.CHAT_TEMPLATE) is not None


def prepare_model(kind: str, folder: Path, model: Path | None = None, shape: Any = None) -> Path:
    from benchmarks.realistic_model import CHAT_TEMPLATE, REALISTIC, write_realistic_model

    if model is not None or kind == "stories260K":
        source = model or SHARED_MODEL
        if not source.is_file():
            raise FileNotFoundError(f"model missing: {source}")
        return source if _has_chat_template(source) else with_chat_template(
            source, folder / f"{source.stem}-chat.gguf", CHAT_TEMPLATE)
    if kind == "realistic":
        return write_realistic_model(folder / "realistic-chat.gguf", shape or REALISTIC, chat_template=CHAT_TEMPLATE)
    raise ValueError(f"unknown model kind {kind!r}: stories260K or realistic")


class ChatModel:
    def __init__(self, path: Path) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from llama_cpp import Llama

        self.path = path
        self._vocab = Llama(model_path=str(path), vocab_only=True, verbose=False)
        meta = self._vocab.metadata
        self.template = meta["tokenizer.chat_template"]
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self._compiled = env.from_string(self.template)
        self.bos_token = self._text(self._vocab.token_bos())
        self.eos_token = self._text(self._vocab.token_eos())

    def _text(self, token: int) -> str:
        return "" if token < 0 else self._vocab.detokenize([token], special=True).decode(errors="replace")

    def count(self, text: str) -> int:
        return len(self._vocab.tokenize(text.encode(), add_bos=False, special=True))

    def render(self, messages: list[Message]) -> str:
        return self._compiled.render(messages=messages, add_generation_prompt=True, bos_token=self.bos_token,
                                     eos_token=self.eos_token)


@dataclass(frozen=True)
class Side:
    name: str
    base_url: str
    root_pid: int
    model_id: str
    bound: bool


def model_id_of(base_url: str) -> str:
    import httpx

    return str(httpx.get(f"{base_url}/v1/models", timeout=30.0).json()["data"][0]["id"])


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def fleet_backend(model: Path | str, w: ChatWorkload, tokens_per_conversation: int, threads: int,
                  kv_layout: str) -> Any:
    """The one backend kvres runs the chat fleet on (a ``BackendConfig``): ``w.slots`` sequences,
    a KV budget of as many conversations (even), the threads and layout asked."""
    from kvres.cluster import BackendConfig

    budget = w.slots * tokens_per_conversation
    budget += budget % 2
    return BackendConfig(name="peers", model_path=model, n_ctx=budget, n_seq_max=w.slots, kv_budget_tokens=budget,
                         n_threads=threads, kv_layout=kv_layout)


class KvresServe:
    def __init__(self, model: Path, w: ChatWorkload, tokens_per_conversation: int, threads: int, kv_layout: str,
                 cold_ram_bytes: int, folder: Path, front: str | None = None, name: str = "kvres") -> None:
        """``front``: ``kvres serve --front`` (None: its default); ``name``: the side's name."""
        folder = folder / name
        folder.mkdir(parents=True, exist_ok=True)
        self.model, self.w, self.threads, self.folder, self.front, self.name = model, w, threads, folder, front, name
        self.tokens_per_conversation, self.kv_layout, self.cold_ram_bytes = tokens_per_conversation, kv_layout, cold_ram_bytes
        self.log_path = folder / "kvres-serve.log"
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    def config_json(self) -> str:
        from kvres.cluster import ColdStoreConfig, KvresConfig

        backend = fleet_backend(self.model, self.w, self.tokens_per_conversation, self.threads, self.kv_layout)
        cold = ColdStoreConfig(ram_budget_bytes=self.cold_ram_bytes, disk_budget_bytes=4 * self.cold_ram_bytes,
                               disk_dir=self.folder / "cold")
        return str(KvresConfig(backends=[backend], cold_store=cold).model_dump_json())

    def start(self, timeout_s: float = START_TIMEOUT_S, attempts: int = 2) -> KvresServe:
        """Started; once more where it exits while starting (on a loaded machine Ray's node can miss
        its 30 s to register)."""
        for attempt in range(attempts):
            try:
                return self._start(timeout_s)
            except PeerStartError as exc:
                if attempt + 1 == attempts or "exited" not in str(exc):
                    raise
                print(f"kvres serve did not start, once more: {str(exc).splitlines()[-1]}", flush=True)
        raise AssertionError("unreachable")

    def _start(self, timeout_s: float) -> KvresServe:
        import httpx

        self.port = free_port()
        command = [sys.executable, "-m", "kvres.cluster.cli", "serve", "--config", self.config_json(),
                   "--port", str(self.port), "--num-cpus", str(max(2, self.threads)),
                   "--min-replicas", "1", "--max-replicas", "1", *(["--front", self.front] if self.front else [])]
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise PeerStartError(f"kvres serve exited with {self._process.returncode}:\n{_tail(self.log_path)}")
            if b"listening on" in self.log_path.read_bytes():
                try:
                    if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=10.0).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
            time.sleep(1.0)
        self.stop()
        raise PeerStartError(f"kvres serve not listening after {timeout_s:.0f} s:\n{_tail(self.log_path)}")

    def side(self) -> Side:
        base = f"http://127.0.0.1:{self.port}"
        assert self._process is not None
        return Side(self.name, base, self._process.pid, model_id_of(base), bound=True)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        started = [(pid, stat.start_ticks) for pid in tree_pids(process.pid)[1:] if (stat := read_stat(pid))]
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        for pid, start in started:  # what this run started and its teardown left behind (the same process)
            stat = read_stat(pid)
            if stat is not None and stat.start_ticks == start:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def __enter__(self) -> KvresServe:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def peer_side(server: LlamaServer) -> Side:
    return Side("llama-server", server.base_url, server.pid, model_id_of(server.base_url), bound=False)


def llama_server_flags(w: ChatWorkload, tokens_per_conversation: int, threads: int, cache_ram_mib: int) -> list[str]:
    n_ctx = w.slots * tokens_per_conversation
    return ["-c", str(n_ctx + n_ctx % 2), "-np", str(w.slots), "--kv-unified", "--cache-ram", str(cache_ram_mib),
            "-t", str(threads), "-tb", str(threads), "--jinja"]
