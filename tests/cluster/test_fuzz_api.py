"""No argument of any public session call crashes a backend: hypothesis throws arbitrary values at
every method of ``Session`` and ``SessionManager`` on a real local Ray cluster with the real llama
engine (stories260K); every refusal is a typed kvres error (or a pydantic ``ValidationError``) whose
message names the argument or its value, the session's log is unchanged by a refused call, and
the backend process is the same one at the end."""

from __future__ import annotations

from typing import Any

import pydantic
import ray
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvres.policy import KvresError

PROMPT = list(range(3, 43))
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
    "stream": lambda s, m, x: list(s.stream(x)),
    "chat": lambda s, m, x: s.chat(x),
    "detokenize": lambda s, m, x: s.detokenize(x),
    "truncate": lambda s, m, x: s.truncate(x),
    "rollback": lambda s, m, x: s.rollback(x),
    "fork": lambda s, m, x: s.fork(x).close(),
    "export": lambda s, m, x: s.export(x),
    "migrate": lambda s, m, x: s.migrate(x),
    "open_session.session_id": lambda s, m, x: m.open_session(session_id=x, backend="b0").close(),
    "open_session.policy": lambda s, m, x: m.open_session(policy=x, backend="b0").close(),
    "session": lambda s, m, x: m.session(x),
}


def _named(exc: BaseException, name: str, value: object) -> bool:
    text = str(exc)
    words = {name.split(".")[-1], "session id", "token", "max_tokens", "path", "message", "count", "length",
             "backend", "policy", "stop", "grammar", "temperature", "seed", "top_p"}
    return repr(value)[:20] in text or str(value)[:20] in text or any(w in text for w in words)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(value=junk)
def _fuzz(manager: Any, session: Any, name: str, value: object) -> None:
    before = session.tokens()
    try:
        CALLS[name](session, manager, value)
    except (KvresError, pydantic.ValidationError) as exc:
        assert _named(exc, name, value), f"{name}({value!r}): {type(exc).__name__}: {exc}"
        assert session.tokens() == before, f"{name}({value!r}) refused but changed the log"


def test_no_argument_of_any_public_call_crashes_a_backend(manager, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # export(junk) may write a file named by junk: here, not in the checkout
    pid = ray.get(manager.backend_handle("b0").pid.remote())
    with manager.open_session(backend="b0") as session:
        session.append(PROMPT)
        for name in CALLS:
            _fuzz(manager, session, name)
        session.tokens()  # the session still answers (an accepted truncate may have shortened it)
    assert ray.get(manager.backend_handle("b0").pid.remote()) == pid  # never restarted: no crash
