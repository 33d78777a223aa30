"""``python -m dapo.plan`` (= ``dapo plan``), see :mod:`dapo.plan.cli`."""

import sys

from dapo.plan.cli import main

sys.exit(main())
