"""``python -m pflarena.cli``: the ``pflarena`` command."""

import sys

from pflarena.cli.command import main

sys.exit(main())
