"""An error on one rank is an error on every rank while a model is built.

:func:`agree_on_error` is called by every rank at the same point (the end of the pre-wrap hook chain);
one ``all_reduce`` of a small tensor over the world group, so a rank whose stage had no problem raises
too, instead of waiting forever in the next collective. Without a multi-rank process group it only
re-raises. torch is imported only when a function here runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from bridge_freeze_plugin.errors import (
    BridgeFreezeError,
    EmptyPartError,
    FreezeGuaranteeError,
    FrozenPartTrainedError,
    PeerRankFreezeError,
    TrainingAuditError,
    UnclassifiedParameterError,
    UnsupportedFreezeFlagError,
)
from bridge_freeze_plugin.ranks import collective_device, world

#: Error codes exchanged between ranks (0: no error). Order matters: first match wins.
_CODES: tuple[type[BaseException], ...] = (
    UnsupportedFreezeFlagError,
    UnclassifiedParameterError,
    FreezeGuaranteeError,
    EmptyPartError,
    FrozenPartTrainedError,
    TrainingAuditError,
    BridgeFreezeError,
    Exception,
)


def _code(error: BaseException | None) -> int:
    if error is None:
        return 0
    return next(i for i, kind in enumerate(_CODES, start=1) if isinstance(error, kind))


def agree_on_error(error: BaseException | None, when: str = "while the model was built") -> None:
    """Make every rank raise if any rank has ``error``; call it on every rank at the same point.

    A rank with its own error re-raises it. A rank without one raises the same plugin error type as the
    lowest failing rank (:class:`PeerRankFreezeError` for any other exception), with that rank's message.
    ``when`` says where the ranks were (the build; the run-time audit says which step).
    """
    dist = world()
    if dist is None:
        if error is not None:
            raise error
        return
    import torch

    rank, size = dist.get_rank(), dist.get_world_size()
    codes = torch.zeros(size, dtype=torch.int64)
    codes[rank] = _code(error)
    codes = codes.to(collective_device())  # NCCL takes CUDA tensors only
    dist.all_reduce(codes)  # SUM: each rank fills its own slot
    codes = codes.cpu()
    failed = [r for r in range(size) if codes[r].item()]
    if not failed:
        return
    first = failed[0]
    message = [f"{type(error).__name__}: {error}" if rank == first else None]
    dist.broadcast_object_list(message, src=first)
    if error is not None:
        error.add_note(f"(raised on global rank {rank}; failing ranks: {failed})")
        raise error
    kind = _CODES[int(codes[first].item()) - 1]
    raised = kind if kind is not Exception and kind is not BridgeFreezeError else PeerRankFreezeError
    raise raised(
        f"global rank {first} (failing ranks: {failed} of {size}) raised {when}, so "
        f"rank {rank} stops too instead of waiting in a collective. Rank {first} said: {message[0]}"
    )


@contextlib.contextmanager
def errors_agreed(enabled: bool = True) -> Iterator[None]:
    """On an exception inside, tell every rank (:func:`agree_on_error`) before raising it.

    For code that every rank runs in step, ahead of the pre-wrap hook (Bridge's ``provide()`` inside
    ``provide_distributed_model``): a rank failing there meets the other ranks' agreement in the hook.
    On success nothing is exchanged (the hook does that once for all).
    """
    if not enabled:
        yield
        return
    try:
        yield
    except Exception as exc:  # every rank must learn of it (agree_on_error re-raises it here)
        agree_on_error(exc)
        raise


def run_agreed(step: Callable[[], Any]) -> Any:
    """``step()`` on every rank, then :func:`agree_on_error` with whatever it raised (or nothing)."""
    error: Exception | None = None
    result = None
    try:
        result = step()
    except Exception as exc:  # noqa: BLE001  (any rank's failure must become every rank's)
        error = exc
    agree_on_error(error)
    return result
