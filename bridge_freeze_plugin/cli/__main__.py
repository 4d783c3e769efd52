"""``python -m bridge_freeze_plugin.cli``: the ``bridge-freeze`` command."""

import sys

from bridge_freeze_plugin.cli import main

sys.exit(main())
