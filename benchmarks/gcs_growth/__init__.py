"""benchmarks.gcs_growth: resident memory of kvres serve's processes under steady chat traffic (python -m benchmarks.gcs_growth)."""
