"""``python -m pflarena``: the ``pflarena`` command."""

import sys

from pflarena.cli import main

sys.exit(main())
