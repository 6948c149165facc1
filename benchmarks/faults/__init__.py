"""benchmarks.faults: what a driver sees when kvres's actors die, its disk fills or its block files
are damaged. Run ``python -m benchmarks.faults [--quick]``; see ``__main__``."""
