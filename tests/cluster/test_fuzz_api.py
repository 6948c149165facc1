"""No argument of any public session call crashes a backend: hypothesis throws arbitrary values at
every method of ``Session`` and ``SessionManager`` on a real local Ray cluster with the real llama
engine (stories260K); every refusal is a typed kvres error (or a pydantic ``ValidationError``) whose
message names the argument or its value, the session's log and the working folder are unchanged by a
refused call, and the backend process is the same one after each call's fuzz (one test per call, so
a run reports every call that fails). Paths are drawn too (``export``, ``restore``): relative ones
land in a folder of the test's own, an absolute one is made relative to it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
import ray
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvres.policy import KvresError
from tests.hypothesis_profiles import examples

PROMPT = list(range(3, 43))
HI = [{"role": "user", "content": "hi"}]
EXPORTED = Path("base.kvsession")  # the fuzzed session as it was before the fuzz, in the test's folder
junk = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.binary(max_size=6),
    st.lists(st.one_of(st.integers(-5, 10**7), st.none(), st.floats(), st.text(max_size=3), st.booleans()),
             max_size=5),
    st.dictionaries(st.text(max_size=4), st.one_of(st.integers(), st.text(max_size=4)), max_size=2),
)
CALLS = {
    "append": lambda s, m, x: s.append(x),
    "generate": lambda s, m, x: s.generate(x),
    "generate.temperature": lambda s, m, x: s.generate(2, temperature=x),
    "generate.seed": lambda s, m, x: s.generate(2, temperature=0.5, seed=x),
    "generate.top_p": lambda s, m, x: s.generate(2, top_p=x),
    "generate.stop": lambda s, m, x: s.generate(2, stop=x),
    "generate.stop_token_ids": lambda s, m, x: s.generate(2, stop_token_ids=x),
    "generate.grammar": lambda s, m, x: s.generate(2, grammar=x),
    "generate.prompt": lambda s, m, x: s.generate(2, prompt=x),
    "generate.top_k": lambda s, m, x: s.generate(2, top_k=x),
    "generate.min_p": lambda s, m, x: s.generate(2, min_p=x),
    "generate.json_schema": lambda s, m, x: s.generate(2, json_schema=x),
    "generate.logprobs": lambda s, m, x: s.generate(2, logprobs=x),
    "generate.top_logprobs": lambda s, m, x: s.generate(2, top_logprobs=x),
    "generate.logit_bias": lambda s, m, x: s.generate(2, logit_bias=x),
    "generate.logit_bias.token": lambda s, m, x: s.generate(2, logit_bias={x if isinstance(x, Hashable) else repr(x):
                                                                           5.0}),
    "generate.ignore_eos": lambda s, m, x: s.generate(2, ignore_eos=x),
    "stream": lambda s, m, x: list(s.stream(x)),
    "chat": lambda s, m, x: s.chat(x),
    "chat.max_tokens": lambda s, m, x: s.chat(HI, max_tokens=x),
    "chat_stream": lambda s, m, x: list(s.chat_stream(x, max_tokens=2)),
    "append_messages": lambda s, m, x: s.append_messages(x),
    "detokenize": lambda s, m, x: s.detokenize(x),
    "detokenize.special": lambda s, m, x: s.detokenize([5], special=x),
    "truncate": lambda s, m, x: s.truncate(x),
    "rollback": lambda s, m, x: s.rollback(x),
    "fork": lambda s, m, x: s.fork(x).close(),
    "export": lambda s, m, x: s.export(_relative(x)),
    "migrate": lambda s, m, x: s.migrate(x),
    "open_session.session_id": lambda s, m, x: m.open_session(session_id=x, backend="b0").close(),
    "open_session.policy": lambda s, m, x: m.open_session(policy=x, backend="b0").close(),
    "open_session.backend": lambda s, m, x: m.open_session(backend=x).close(),
    "open_session.model": lambda s, m, x: m.open_session(model=x).close(),
    "open_session.placement": lambda s, m, x: m.open_session(placement=x).close(),
    "session": lambda s, m, x: m.session(x),
    "backend": lambda s, m, x: m.backend(x),
    "restore": lambda s, m, x: m.restore(x, session_id=_fresh_id()).close(),
    "restore.session_id": lambda s, m, x: m.restore(EXPORTED, session_id=x).close(),
    "restore.backend": lambda s, m, x: m.restore(EXPORTED, session_id=_fresh_id(), backend=x).close(),
    "restore.model": lambda s, m, x: m.restore(EXPORTED, session_id=_fresh_id(), model=x).close(),
}


def _relative(path: object) -> object:
    """An absolute path string made relative (``/a`` -> ``./a``): an export never writes from the
    machine's root down; ``/`` itself stays (a directory: refused, nothing written)."""
    return "." + path if isinstance(path, str) and path.startswith("/") and path.strip("/") else path


def _fresh_id() -> str:
    return f"r-{uuid.uuid4().hex[:12]}"


def _named(exc: BaseException, name: str, value: object) -> bool:
    text = str(exc)
    words = {name.split(".")[-1], "session id", "token", "max_tokens", "path", "message", "count", "length",
             "backend", "policy", "stop", "grammar", "temperature", "seed", "top_p"}
    return repr(value)[:20] in text or str(value)[:20] in text or any(w in text for w in words)


@settings(max_examples=examples(12), deadline=None, suppress_health_check=list(HealthCheck))
@given(value=junk)
def _fuzz(manager: Any, session: Any, name: str, value: object) -> None:
    before, files = session.tokens(), sorted(os.listdir())
    try:
        CALLS[name](session, manager, value)
    except (KvresError, pydantic.ValidationError) as exc:
        assert _named(exc, name, value), f"{name}({value!r}): {type(exc).__name__}: {exc}"
        assert session.tokens() == before, f"{name}({value!r}) refused but changed the log"
        assert sorted(os.listdir()) == files, f"{name}({value!r}) refused but left a file behind"


@pytest.fixture(scope="module")
def fuzzed(manager: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, int]]:
    """One session (of PROMPT, exported to EXPORTED) that every call is fuzzed on, in turn, and the
    pid of its backend; the working directory is a folder of the module's own meanwhile."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.mktemp("fuzz"))  # export(junk) may write a file named by junk
        pid = ray.get(manager.backend_handle("b0").pid.remote())
        with manager.open_session(backend="b0") as session:
            session.append(PROMPT)
            session.export(EXPORTED)
            yield session, pid


@pytest.mark.parametrize("name", CALLS)
def test_no_argument_of_any_public_call_crashes_a_backend(manager: Any, fuzzed: tuple[Any, int], name: str) -> None:
    session, pid = fuzzed
    _fuzz(manager, session, name)
    session.tokens()  # the session still answers (an accepted truncate may have shortened it)
    assert ray.get(manager.backend_handle("b0").pid.remote()) == pid  # never restarted: no crash
