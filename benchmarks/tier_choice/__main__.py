"""Entry point: ``.venv/bin/python -m benchmarks.tier_choice`` (see ``benchmarks.tier_choice.bench``)."""

from benchmarks.tier_choice.bench import main

raise SystemExit(main())
