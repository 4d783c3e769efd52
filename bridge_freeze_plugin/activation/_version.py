"""The Megatron-Bridge this process runs, against the range the plugin is tested on.

CI runs the pinned release (0.6.2); the compatibility lane (``scripts/compat_lane.py``, docs/development.md) runs
the commits the plugin's users pin: SkyRL's (0.6.0-era) and NeMo-RL's (main, 0.7.0). A Bridge outside
``0.6.0 <= version < 0.8`` is named once per process, at activation, on rank 0, as a WARNING: the plugin still
activates (its checks raise where a layout is not what a family describes), but nobody has run it there.
"""

from __future__ import annotations

import logging
from typing import Any

from bridge_freeze_plugin.export import bridge_version
from bridge_freeze_plugin.ranks import is_rank0

logger = logging.getLogger("bridge_freeze_plugin")

__all__ = ["TESTED_BRIDGE", "warn_untested_bridge"]

#: the oldest Bridge tested (inclusive) and the first release line not tested (exclusive)
TESTED_BRIDGE: tuple[tuple[int, int, int], tuple[int, int, int]] = ((0, 6, 0), (0, 8, 0))
_WARNED: set[str] = set()


def _range() -> str:
    low, high = TESTED_BRIDGE
    return f">= {'.'.join(map(str, low))}, < {'.'.join(map(str, high))}"


def warn_untested_bridge(_module: Any = None) -> None:
    """Log once, on rank 0, a WARNING naming a Bridge outside :data:`TESTED_BRIDGE` (or one of unknown version)."""
    text, parsed = bridge_version()
    if text in _WARNED:
        return
    low, high = TESTED_BRIDGE
    if parsed is not None and low <= parsed < high:
        return
    _WARNED.add(text)
    if is_rank0():
        logger.warning(
            "bridge-freeze: Megatron-Bridge %s is outside the tested range (%s); the plugin activates, but its "
            "families, build paths and weight sync are untested there (docs/development.md: the compatibility lane)",
            text, _range(),
        )
