"""``python -m nsa.bench``: the ``nsa-bench`` command (see :mod:`nsa.bench.cli`)."""

import sys

from nsa.bench.cli import main

sys.exit(main())
