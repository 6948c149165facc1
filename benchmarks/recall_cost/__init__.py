"""What a recall turn costs, beside re-prefilling the session's token log (``python -m benchmarks.recall_cost``)."""
