"""Which thread of the process decodes with its context's ``n_threads``.

Primitives:
- ``claim_decode_threads()``: the calling thread becomes the one thread of the process whose
  decodes use their context's ``n_threads``; ``reserve_decode_threads()``: until some thread
  claims, every thread decodes on one thread.
- ``may_use_threads()``: whether the calling thread's decodes may use more than one thread (the
  first thread to ask takes it when none holds it and none is reserved to).

Why one: llama.cpp's CPU backend runs a decode of more than one thread as an OpenMP region, and
libgomp keeps a team of workers for every thread that ever ran one, as long as that thread lives.
Two teams on few cores make libgomp stop spinning between regions, and every decode of either then
waits for woken workers (2-3x slower, docs/notes.md). So only one thread decodes with
``n_threads``: the first to decode, or the one that claimed it (a backend's step loop); any other
(a control call that scores or applies a K-shift) decodes on one thread, which needs no team and
gives the same numbers.
"""

from __future__ import annotations

import threading

_team_lock = threading.Lock()
_team: threading.Thread | None = None  # the thread whose decodes use n_threads
_reserved = False  # a thread will claim it: meanwhile nobody takes it by decoding first


def claim_decode_threads() -> None:
    global _team, _reserved
    with _team_lock:
        _team, _reserved = threading.current_thread(), False


def reserve_decode_threads() -> None:
    global _reserved
    with _team_lock:
        if _team is None or not _team.is_alive():
            _reserved = True


def may_use_threads() -> bool:
    """Whether the calling thread's decodes may use more than one thread (see the module doc)."""
    global _team
    me = threading.current_thread()
    team = _team
    if team is me:
        return True
    if team is not None and team.is_alive():
        return False
    with _team_lock:
        if _team is None or not _team.is_alive():
            if _reserved:
                return False
            _team = me
        return _team is me
