"""Progress of work that takes seconds (a model load, a long append's prefill), for whoever watches.

Primitives:
- ``Progress(what, total=None, unit="tokens", stream=None)``: ``update(done)`` (the count so far),
  ``close()``. On a terminal (``stream.isatty()``) with tqdm importable, a tqdm bar; otherwise
  plain lines (``HH:MM:SS kvres: <what>: 1,024/4,096 tokens (25%), 812 tokens/s``), at most one
  every ``LINE_EVERY_S`` seconds and one at the end, so a log holds a few lines, not a bar's
  carriage returns.
- ``loading(what, stream=None)``: a context manager for work with no count (a model load): a line
  when it starts, one every ``LINE_EVERY_S`` while it lasts (on a terminal, a tqdm timer instead),
  one with its time when it ends.
- ``watch(read, total, what, stream=None, after_s=WATCH_AFTER_S, poll_s=POLL_S) -> Watcher``: a
  daemon thread that reports ``read()`` against ``total`` (an append's log length as it grows)
  once the work has lasted ``after_s`` (short work says nothing); ``Watcher.stop()`` ends it with
  a last line when it reported anything.

In a Ray actor stderr is a log file (not a terminal), which Ray forwards to the driver: plain lines.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

LINE_EVERY_S = 5.0
WATCH_AFTER_S = 2.0
POLL_S = 0.5


def _stream(stream: TextIO | None) -> TextIO:
    return sys.stderr if stream is None else stream


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _line(stream: TextIO, text: str) -> None:
    stream.write(f"{time.strftime('%H:%M:%S')} kvres: {text}\n")
    stream.flush()


class Progress:
    def __init__(self, what: str, total: int | None = None, unit: str = "tokens", stream: TextIO | None = None,
                 start: int = 0) -> None:
        self.what, self.total, self.unit = what, total, unit
        self.stream = _stream(stream)
        self.done = start
        self._start, self._t0, self._last_line = start, time.monotonic(), 0.0
        self._bar: Any = None
        if _is_terminal(self.stream):
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, initial=start, desc=what, unit=f" {unit}", file=self.stream,
                                 leave=True, dynamic_ncols=True)
            except ImportError:  # plain lines then
                self._bar = None

    def describe(self) -> str:
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        rate = (self.done - self._start) / elapsed
        of = "" if self.total is None else f"/{self.total:,}"
        share = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        return f"{self.what}: {self.done:,}{of} {self.unit}{share}, {rate:,.0f} {self.unit}/s, {elapsed:.1f} s"

    def update(self, done: int) -> None:
        if self._bar is not None:
            self._bar.update(done - self.done)
            self.done = done
            return
        self.done = done
        now = time.monotonic()
        if now - self._last_line >= LINE_EVERY_S:
            self._last_line = now
            _line(self.stream, self.describe())

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        else:
            _line(self.stream, self.describe() + " (done)")


@contextmanager
def loading(what: str, stream: TextIO | None = None) -> Iterator[None]:
    out = _stream(stream)
    t0 = time.monotonic()
    stop = threading.Event()
    _line(out, f"{what} ...")
    bar: Any = None
    if _is_terminal(out):
        try:
            from tqdm import tqdm

            bar = tqdm(total=None, desc=what, file=out, bar_format="{desc}: {elapsed}", leave=False)
        except ImportError:  # plain lines then
            bar = None

    def tick() -> None:
        while not stop.wait(1.0 if bar is not None else LINE_EVERY_S):
            if bar is not None:
                bar.refresh()
            else:
                _line(out, f"{what}: still at it, {time.monotonic() - t0:.0f} s")

    ticker = threading.Thread(target=tick, name="kvres-progress", daemon=True)
    ticker.start()
    try:
        yield
    except BaseException:
        _line(out, f"{what}: failed after {time.monotonic() - t0:.1f} s")
        raise
    finally:
        stop.set()
        ticker.join()
        if bar is not None:
            bar.close()
    _line(out, f"{what}: done in {time.monotonic() - t0:.1f} s")


class Watcher:
    def __init__(self, read: Callable[[], int], total: int, what: str, stream: TextIO | None,
                 after_s: float, poll_s: float, start: int) -> None:
        self._read, self._total, self._what, self._stream = read, total, what, stream
        self._after_s, self._poll_s, self._start = after_s, poll_s, start
        self._stop = threading.Event()
        self.progress: Progress | None = None
        self._thread = threading.Thread(target=self._run, name="kvres-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if self._stop.wait(self._after_s):
            return
        self.progress = Progress(self._what, self._total, stream=self._stream, start=self._start)
        while not self._stop.is_set():
            try:
                self.progress.update(min(self._read(), self._total))
            except Exception:  # the session went away: nothing more to report
                return
            self._stop.wait(self._poll_s)

    def stop(self, done: int | None = None) -> None:
        self._stop.set()
        self._thread.join()
        if self.progress is not None:
            if done is not None:
                self.progress.done = done
            self.progress.close()


def watch(read: Callable[[], int], total: int, what: str, stream: TextIO | None = None,
          after_s: float = WATCH_AFTER_S, poll_s: float = POLL_S, start: int = 0) -> Watcher:
    return Watcher(read, total, what, stream, after_s, poll_s, start)
