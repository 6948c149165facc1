"""Hypothesis profiles of the suite, chosen by ``KVRES_HYPOTHESIS_PROFILE``.

Primitives:
- ``load_profile()``: registers the profiles and loads the one the environment names
  (``tests/conftest.py`` calls it before any test module is imported).
- ``examples(n)``: a test's ``max_examples`` under the loaded profile (``n``, or ``FUZZ_SCALE * n``).

``repeatable`` (the default: ``make test``, CI): every property test draws from a seed fixed by the
test itself (``derandomize``) and no example database is read or written, so each run draws the same
examples and a failure shows in every run. ``fuzz`` (``make fuzz``): random seeds and ``FUZZ_SCALE``
times the examples; a failure prints its ``@reproduce_failure`` blob and is kept in ``.hypothesis/``,
where the next fuzz run replays it first.
"""

from __future__ import annotations

import os

from hypothesis import settings

ENV = "KVRES_HYPOTHESIS_PROFILE"
REPEATABLE, FUZZ = "repeatable", "fuzz"
FUZZ_SCALE = 10


def load_profile() -> None:
    base = settings.get_profile("default")  # not the "ci" profile hypothesis loads where CI is set
    settings.register_profile(REPEATABLE, base, derandomize=True, database=None, print_blob=True)
    # No deadline: on a loaded machine a slow example is noise, not a finding.
    settings.register_profile(FUZZ, base, max_examples=FUZZ_SCALE * base.max_examples, deadline=None,
                              print_blob=True)
    settings.load_profile(os.environ.get(ENV) or REPEATABLE)


def examples(n: int) -> int:
    return FUZZ_SCALE * n if settings.get_current_profile_name() == FUZZ else n
