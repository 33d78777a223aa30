"""``python -m dapo.train``: the training entrypoint (see :mod:`dapo.train.cli`)."""

import sys

from dapo.train.cli import main

sys.exit(main())
