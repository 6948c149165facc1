"""T* tier choice on this machine: ``.venv/bin/python -m benchmarks.tier_choice`` (see ``bench``)."""
