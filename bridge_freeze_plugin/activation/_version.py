"""The Megatron-Bridge this process runs, against the range the plugin is tested on.

CI runs the pinned release (0.6.2); the compatibility lane (``scripts/compat_lane.py``, docs/development.md) runs
the commits the plugin's users pin, and passed the whole suite on SkyRL's 91a15142 (0.6.0) and on NeMo-RL's
8c46dc42 (0.7.0); the range is release lines, ``0.6.0 <= version < 0.8``. A Bridge outside it is named once per
process, at activation, on rank 0, as a WARNING: the plugin still activates (its checks raise where a layout is not
what a family describes), but nobody has run it there.

A version string is shared by many commits (every commit of Bridge's main branch since 80754e51b, 2026-08-04, says
0.7.0). So at activation rank 0 also logs, once per process at INFO, the commit where the installation records one
(:func:`~bridge_freeze_plugin.activation._bridge_commit.bridge_commit`: pip's ``direct_url.json`` for an install
from git, or the HEAD of the Megatron-Bridge checkout the package is imported from), and otherwise that the commit
cannot be told and why (a wheel from a package index records none). The same commit text joins the WARNING.
"""

from __future__ import annotations

import logging
from typing import Any

from bridge_freeze_plugin.activation._bridge_commit import bridge_commit
from bridge_freeze_plugin.export import bridge_version
from bridge_freeze_plugin.ranks import is_rank0

logger = logging.getLogger("bridge_freeze_plugin")

__all__ = ["TESTED_BRIDGE", "commit_text", "warn_untested_bridge"]

#: the oldest Bridge tested (inclusive) and the first release line not tested (exclusive)
TESTED_BRIDGE: tuple[tuple[int, int, int], tuple[int, int, int]] = ((0, 6, 0), (0, 8, 0))
_WARNED: set[str] = set()
_TOLD: set[str] = set()


def _range() -> str:
    low, high = TESTED_BRIDGE
    return f">= {'.'.join(map(str, low))}, < {'.'.join(map(str, high))}"


def commit_text() -> str:
    """``commit <hash> (<how it was told>)``, or ``commit not told: <why>``, for the imported Bridge."""
    commit, how = bridge_commit()
    return f"commit {commit} ({how})" if commit else f"commit not told: {how}"


def warn_untested_bridge(_module: Any = None) -> None:
    """Log once per version, on rank 0: the Bridge and its commit at INFO, and a WARNING naming a Bridge outside
    :data:`TESTED_BRIDGE` (or one of unknown version)."""
    text, parsed = bridge_version()
    if text in _WARNED or not is_rank0():
        return
    commit = None
    if text not in _TOLD:
        _TOLD.add(text)
        commit = commit_text()
        logger.info("bridge-freeze: Megatron-Bridge %s, %s", text, commit)
    low, high = TESTED_BRIDGE
    if parsed is not None and low <= parsed < high:
        return
    _WARNED.add(text)
    logger.warning(
        "bridge-freeze: Megatron-Bridge %s is outside the tested range (%s); the plugin activates, but its "
        "families, build paths and weight sync are untested there (docs/development.md: the compatibility lane); %s",
        text, _range(), commit or commit_text(),
    )
