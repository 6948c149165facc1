"""kvres.actors.backend_setup: a ``BackendConfig`` turned into what its backend runs.

``engine_registry``: one spec per engine name and the executor built from it; ``kv_budget``: the
context and token budget a config's KV memory buys (T0); ``kv_config``: the config a backend
runs with (T0, then the T* choice of KV types, and the llama.cpp KV layout: ``resolve_kv_layout``);
``kv_layout_choice``: that layout chosen from the backend's sizes where the config leaves it.
Above ``engines`` (what it builds) and ``sizing`` (what it measures with); neither imports it.
"""
