"""``python -m dapo.bench`` (= ``dapo bench``), see :mod:`dapo.bench.cli`."""

import sys

from dapo.bench.cli import main

sys.exit(main())
