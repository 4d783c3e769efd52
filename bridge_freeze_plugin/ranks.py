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


def collective_device(group: Any = None) -> Any:
    """The device a small tensor must be on for a collective over ``group`` (the world by default).

    A gloo group (or a machine without CUDA) takes CPU tensors; NCCL, which Bridge's training uses by default
    (``distributed_backend="nccl"``), takes only CUDA tensors, on the rank's current device.
    """
    import torch
    import torch.distributed as dist

    backend = str(dist.get_backend(group)).lower()
    if "gloo" in backend or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())
