"""``kvres serve --front direct``: the same application without Ray Serve, two fronts sharing the
port. A chat turn streamed and not through the ``openai`` client, a bound session's second turn
prefilling only its new message, keys checked, ``/metrics`` served; a second server on the taken
port fails saying so. (The whole HTTP suite runs on it with ``KVRES_SERVE_FRONT=direct``.)"""

from __future__ import annotations

import secrets
import subprocess
import sys

import httpx
import pytest

from tests.conftest import REPO_ROOT
from tests.serve.conftest import free_port, start_server, stop_server, wait_healthy


@pytest.fixture(scope="module")
def direct(tmp_path_factory: pytest.TempPathFactory):
    srv = start_server(tmp_path_factory.mktemp("direct"), free_port(), key=f"k-{secrets.token_hex(8)}",
                       args=["--front", "direct"])
    wait_healthy(srv)
    yield srv
    stop_server(srv)


def test_turns_streamed_and_not_and_a_bound_session(direct) -> None:
    client = direct.client()
    messages = [{"role": "user", "content": "hello"}]
    whole = client.chat.completions.create(model=direct.model, messages=messages, max_tokens=8, temperature=0)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        model=direct.model, messages=messages, max_tokens=8, temperature=0, stream=True) if chunk.choices)
    assert whole.choices[0].message.content == streamed and streamed
    sid = {"X-Session-Id": f"direct-{secrets.token_hex(4)}"}
    first = client.chat.completions.create(model=direct.model, messages=messages, max_tokens=8, temperature=0,
                                           extra_headers=sid)
    messages += [{"role": "assistant", "content": first.choices[0].message.content or ""},
                 {"role": "user", "content": "what is 3 plus 4?"}]
    second = client.chat.completions.create(model=direct.model, messages=messages, max_tokens=8, temperature=0,
                                            extra_headers=sid)
    assert first.usage is not None and second.usage is not None and second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens + first.usage.completion_tokens - 1


def test_keys_and_metrics(direct) -> None:
    assert httpx.get(f"{direct.v1}/models", timeout=30).status_code == 401
    metrics = httpx.get(f"{direct.base}/metrics", headers=direct.headers(), timeout=30)
    assert metrics.status_code == 200 and "kvres_serve_requests_total" in metrics.text


def test_a_second_server_on_the_taken_port_fails_naming_it(direct) -> None:
    port = direct.base.rsplit(":", 1)[1]
    out = subprocess.run([sys.executable, "-m", "kvres.cluster.cli", "serve", "--front", "direct", "--port", port,
                          "--num-cpus", "1", "--namespace", f"taken-{secrets.token_hex(4)}"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode != 0 and f"127.0.0.1:{port} is taken" in out.stderr, out.stderr[-2000:]
