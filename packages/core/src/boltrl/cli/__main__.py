"""``python -m boltrl.cli`` is the ``boltrl`` command."""

import sys

from boltrl.cli import main

sys.exit(main())
