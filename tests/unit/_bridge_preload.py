"""What the suite's forkserver imports once (``bridge_forkserver`` in tests/unit/conftest.py): Bridge, as the
command and the workers import it (through the harness's TE stub; the plugin activates by its autoload hook).

Every process the tests start from that server (a ``bridge-freeze`` command, a gloo rank, plan's fake world) is
forked with Bridge loaded, instead of importing it again (about 15 CPU-seconds each).
"""

from __future__ import annotations

import logging

from bridge_freeze_harness.cpu_runtime import import_bridge

_root = logging.getLogger()
_handlers, _level = list(_root.handlers), _root.level
import_bridge()
# A command configures logging (main: logging.basicConfig) before it imports Bridge, which makes the
# logging.basicConfig at the top of megatron/training/training.py a no-op there: undone here, so that a process
# forked from this server configures logging as a fresh one does.
for _handler in [h for h in _root.handlers if h not in _handlers]:
    _root.removeHandler(_handler)
_root.setLevel(_level)
