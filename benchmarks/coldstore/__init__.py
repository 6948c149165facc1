"""Cold-store benchmark: put/get throughput per tier against same-run baselines, as ratios.

Run from the repository root: ``.venv/bin/python -m benchmarks.coldstore [--out DIR] [--quick]``
(writes ``coldstore.json`` and ``coldstore.png``, default into benchmarks/results). See
``benchmarks.coldstore.bench`` for what is measured.
"""
