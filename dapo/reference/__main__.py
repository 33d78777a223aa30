"""``python -m dapo.reference --preset full [overrides]``, see :mod:`dapo.reference.command`."""

import sys

from dapo.reference.command import main

sys.exit(main())
