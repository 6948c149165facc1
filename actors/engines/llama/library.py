"""llama-cpp-python loaded once per process, with llama.cpp's log routed to Python's logging.

Primitives:
- ``load_llama()``: the ``llama_cpp`` module, its backends initialised and its log callback
  installed (once per process): every line goes to the ``kvres.llama`` logger (llama.cpp's
  warnings as info: they name things callers cannot act on, such as unused special-token ids).
- ``captured_log()``: a context manager giving the list that collects the log lines the calling
  thread makes llama.cpp print meanwhile (what it said when it refused something).
- ``eval_callback(fn)``: a Python ``fn(tensor_ptr, ask, user) -> bool`` as the ggml scheduler
  callback a context's ``cb_eval`` takes.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

logger = logging.getLogger("kvres.llama")

# ggml levels: 1 debug, 2 info, 3 warn, 4 error, 5 continuation.
_GGML_LOG_TO_LOGGING = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.INFO, 4: logging.WARNING}
_init_lock = threading.Lock()
_log_callback: Any = None
_listening = threading.local()  # ``lines``: where this thread's llama.cpp log lines also go


def load_llama() -> Any:
    """The llama_cpp module, with the backend initialised and its log routed once per process."""
    global _log_callback
    import llama_cpp

    with _init_lock:
        if _log_callback is None:
            last = [logging.DEBUG]

            def forward(level: int, text: bytes, _user: Any) -> None:
                if level != 5:
                    last[0] = _GGML_LOG_TO_LOGGING.get(level, logging.DEBUG)
                line = text.decode("utf-8", "replace").rstrip()
                if getattr(_listening, "lines", None) is not None:
                    _listening.lines.append(line)
                logger.log(last[0], "%s", line)

            _log_callback = llama_cpp.llama_log_callback(forward)
            llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
    return llama_cpp


@contextlib.contextmanager
def captured_log() -> Iterator[list[str]]:
    lines: list[str] = []
    _listening.lines = lines
    try:
        yield lines
    finally:
        _listening.lines = None


def eval_callback(fn: Callable[[int, bool, Any], bool]) -> Any:
    return load_llama().ggml_backend_sched_eval_callback(fn)
