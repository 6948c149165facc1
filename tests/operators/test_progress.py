"""Progress of work that takes seconds: plain lines off a terminal, and the watcher of a long append."""

from __future__ import annotations

import io
import threading

import pytest

from kvres.actors.ray_actors.progress import Progress, loading, watch


def test_progress_off_a_terminal_is_plain_lines() -> None:
    out = io.StringIO()
    p = Progress("prefill", total=4096, stream=out)
    p.update(1024)
    p.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert "kvres: prefill: 1,024/4,096 tokens (25%)" in lines[0]
    assert lines[-1].endswith("(done)") and "1,024/4,096" in lines[-1]


def test_loading_says_when_it_starts_and_how_long_it_took() -> None:
    out = io.StringIO()
    with loading("backend 'b0': loading m.gguf", stream=out):
        pass
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("backend 'b0': loading m.gguf ...")
    assert "backend 'b0': loading m.gguf: done in" in lines[-1]
    out = io.StringIO()
    with pytest.raises(RuntimeError), loading("load", stream=out):
        raise RuntimeError("no such file")
    assert "load: failed after" in out.getvalue().splitlines()[-1]


def test_watch_reports_a_count_as_it_grows_then_its_end() -> None:
    out = io.StringIO()
    done = [0]
    seen = threading.Event()

    def read() -> int:
        done[0] += 512
        seen.set()
        return done[0]

    watcher = watch(read, 2048, "session 's' prefill", stream=out, after_s=0, poll_s=0.01)
    assert seen.wait(60)
    watcher.stop(2048)
    text = out.getvalue()
    assert "session 's' prefill: " in text and "/2,048 tokens" in text
    assert text.splitlines()[-1].endswith("(done)") and "2,048/2,048 tokens (100%)" in text.splitlines()[-1]


def test_short_work_says_nothing() -> None:
    out = io.StringIO()
    watch(lambda: 1, 10, "quick", stream=out, after_s=3600).stop(10)
    assert out.getvalue() == ""


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_tqdm_draws_a_bar() -> None:
    out = _Terminal()
    p = Progress("prefill", total=100, stream=out)
    p.update(40)
    p.close()
    assert "\r" in out.getvalue() and "40/100" in out.getvalue()  # tqdm redraws in place
    out = _Terminal()
    with loading("loading m.gguf", stream=out):
        pass
    assert "kvres: loading m.gguf: done in" in out.getvalue().splitlines()[-1]
