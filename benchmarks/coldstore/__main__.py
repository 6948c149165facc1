"""Entry point: ``.venv/bin/python -m benchmarks.coldstore`` (see ``benchmarks.coldstore.bench``)."""

from benchmarks.coldstore.bench import main

raise SystemExit(main())
