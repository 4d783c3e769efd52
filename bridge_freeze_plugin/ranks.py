"""Which process this is: global rank 0 logs and warns; collectives need a multi-rank process group.

Never imports torch itself: it looks at ``torch.distributed`` only if something already imported it.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def world() -> Any | None:
    """``torch.distributed`` when a process group with more than one rank is up, else ``None``."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist if dist.get_world_size() > 1 else None


def is_rank0() -> bool:
    """Global rank 0 (or no process group at all)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return bool(dist.get_rank() == 0)
    return os.environ.get("RANK", "0") == "0"
