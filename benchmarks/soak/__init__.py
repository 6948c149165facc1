"""``python -m benchmarks.soak``: kvres serve under HTTP chat traffic for a long while, its processes killed on a schedule."""
