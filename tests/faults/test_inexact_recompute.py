"""A recompute that cannot be exact is reported, never silent: a streaming session that evicted
with re-basing holds KV its later tokens computed while the evicted ones were still there; when
its backend dies that KV is recomputed from the log without them. The session's stats count the
tokens so recomputed and the backend logs a warning naming the session; the session goes on. A
stream repeated after the death never hands out a token the log does not hold."""

from __future__ import annotations

import contextlib

from kvres.cluster import SessionPolicy
from kvres.policy.errors import BackendLostError

from .conftest import kill, logged

PROMPT = [1, *range(100, 400)]
WARNING = "recomputed from its log differ from the KV they replace"


def test_a_rebased_streaming_session_rebuilt_after_a_death_reports_its_inexact_tokens(faulty) -> None:
    policy = SessionPolicy.streaming(128, recent_tokens=32)
    ref = faulty.open_session(backend="f0", policy=policy)
    ref.append(PROMPT)
    want_first, want_second = ref.generate(8), ref.generate(24)
    assert ref.stats()["counters"]["inexact_recomputed_tokens"] == 0  # no fault, nothing recomputed
    ref.close()

    s = faulty.open_session(backend="f0", policy=policy)
    s.append(PROMPT)
    assert s.generate(8) == want_first
    before = s.stats()
    assert before["counters"]["evictions"] > 0
    kill(faulty.backend_handle("f0"))
    second = s.generate(24)  # rebuilt: its resident KV recomputed from the log, without the evicted context
    after = s.stats()
    assert after["counters"]["rebuilds"] == 1
    assert after["counters"]["inexact_recomputed_tokens"] == before["resident_tokens"] > 0
    assert after["token_count"] == len(PROMPT) + 32
    assert second[0] == want_second[0]  # sampled from the logits the journal kept
    lines = logged(WARNING, repr(s.session_id))
    assert lines and f"{before['resident_tokens']} tokens" in lines[0], lines
    # the divergence, if any, is what the counter and the warning announced; the session goes on
    assert len(s.generate(8)) == 8
    s.close()


def test_a_stream_repeated_after_a_death_hands_out_no_token_the_log_does_not_hold(faulty) -> None:
    """The stream is repeated from its request after the death; where the inexactly recomputed KV
    makes the repeat give other tokens than those already handed out, the stream ends there
    (``BackendLostError`` saying so) and the log keeps the tokens the two agree on: its reader was
    handed every token the log holds, and no token of the repeat it was not handed."""
    policy = SessionPolicy.streaming(128, recent_tokens=32)
    s = faulty.open_session(backend="f0", policy=policy)
    s.append(PROMPT)
    s.generate(8)
    before = len(s.tokens())
    got: list[int] = []
    with contextlib.suppress(BackendLostError):
        for i, token in enumerate(s.stream(40)):
            got.append(token)
            if i == 10:
                kill(faulty.backend_handle("f0"))
    log = s.tokens()[before:]
    assert log == got[:len(log)], (log, got)
    assert s.stats()["counters"]["inexact_recomputed_tokens"] > 0
    assert len(s.generate(4)) == 4  # the session goes on
    s.close()
