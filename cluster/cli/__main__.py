"""``python -m kvres.cluster.cli``: the ``kvres`` command line."""

import sys

from . import main

sys.exit(main())
