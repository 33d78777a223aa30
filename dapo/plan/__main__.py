"""``python -m dapo.plan`` (= ``dapo plan``), see :mod:`dapo.plan.estimate`."""

import sys

from dapo.plan.estimate import main

sys.exit(main())
