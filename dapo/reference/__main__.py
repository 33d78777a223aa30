"""``python -m dapo.reference --preset full [overrides]``, see :mod:`dapo.reference.translate`."""

import sys

from dapo.reference.translate import main

sys.exit(main())
