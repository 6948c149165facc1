"""``kvres serve --front serve``: the same application as a Ray Serve deployment (the package's server
runs the default front, inside the backend's process; the session-lifetime module the direct one). A chat turn streamed and not
through the ``openai`` client, a bound session's second turn prefilling only its new message, keys
checked, ``/metrics`` served; a direct front on the port Serve's proxy holds fails saying so, before
it starts anything. (The whole HTTP suite runs on Serve with ``KVRES_SERVE_FRONT=serve``.)"""

from __future__ import annotations

import secrets
import subprocess
import sys

import httpx
import pytest

from tests.conftest import REPO_ROOT
from tests.serve.conftest import free_port, start_server, stop_server, wait_healthy


@pytest.fixture(scope="module")
def on_serve(tmp_path_factory: pytest.TempPathFactory):
    srv = start_server(tmp_path_factory.mktemp("serve-front"), free_port(), key=f"k-{secrets.token_hex(8)}",
                       args=["--front", "serve"])
    wait_healthy(srv)
    yield srv
    stop_server(srv)


def test_turns_streamed_and_not_and_a_bound_session(on_serve) -> None:
    client = on_serve.client()
    messages = [{"role": "user", "content": "hello"}]
    whole = client.chat.completions.create(model=on_serve.model, messages=messages, max_tokens=8, temperature=0)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        model=on_serve.model, messages=messages, max_tokens=8, temperature=0, stream=True) if chunk.choices)
    assert whole.choices[0].message.content == streamed and streamed
    sid = {"X-Session-Id": f"direct-{secrets.token_hex(4)}"}
    first = client.chat.completions.create(model=on_serve.model, messages=messages, max_tokens=8, temperature=0,
                                           extra_headers=sid)
    messages += [{"role": "assistant", "content": first.choices[0].message.content or ""},
                 {"role": "user", "content": "what is 3 plus 4?"}]
    second = client.chat.completions.create(model=on_serve.model, messages=messages, max_tokens=8, temperature=0,
                                            extra_headers=sid)
    assert first.usage is not None and second.usage is not None and second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens + first.usage.completion_tokens - 1


def test_keys_and_metrics(on_serve) -> None:
    assert httpx.get(f"{on_serve.v1}/models", timeout=30).status_code == 401
    metrics = httpx.get(f"{on_serve.base}/metrics", headers=on_serve.headers(), timeout=30)
    assert metrics.status_code == 200 and "kvres_serve_requests_total" in metrics.text


def test_a_second_server_on_the_taken_port_fails_naming_it(on_serve) -> None:
    port = on_serve.base.rsplit(":", 1)[1]
    out = subprocess.run([sys.executable, "-m", "kvres.cluster.cli", "serve", "--front", "direct", "--port", port,
                          "--num-cpus", "1", "--namespace", f"taken-{secrets.token_hex(4)}"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and f"127.0.0.1:{port} is taken" in out.stderr, out.stderr[-2000:]
