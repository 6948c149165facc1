"""``python -m benchmarks.fleet``: many chat sessions over few slots (issue #32); see ``__main__``."""
