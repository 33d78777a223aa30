"""``python -m dapo.eval`` (= ``dapo eval``), see :mod:`dapo.eval.cli`."""

import sys

from dapo.eval.cli import main

sys.exit(main())
