"""Passkey retrieval under eviction: ``python -m benchmarks.passkey`` (see ``__main__``); the shared
evaluation logic is ``benchmarks.passkey.harness`` (also used by tests/models/test_passkey_retrieval.py)."""
