"""benchmarks.serve: session-bound against stateless HTTP chat clients (python -m benchmarks.serve)."""
