"""Model-wide reports and collective errors under tensor, pipeline, expert and data parallelism.

Each rank holds a piece of the model: a tensor-parallel shard of its pipeline stage (or of its virtual
pipeline chunks), replicated over data-parallel ranks. Two things must hold on every rank:

- the report counts the whole model once: :func:`model_wide_report` sums the per-part counts over
  tensor-, pipeline- (and expert-) parallel ranks, never over data-parallel (or context-parallel)
  replicas; a parameter duplicated over tensor-parallel ranks (``tensor_model_parallel`` false or
  absent: layer norms, biases of row-parallel layers, most HF vision towers) counts once; the copy of a
  tied embedding / output weight that Megatron keeps on the last pipeline stage (marked ``shared``)
  is not counted again. One ``all_reduce`` of a small tensor per report; every rank gets the same report.
- an error on one rank is an error on all ranks: :func:`collective_hook` runs the pre-wrap hook chain,
  then :func:`agree_on_error` (one ``all_reduce`` over the world group), so a rank whose stage had no
  problem raises too, instead of waiting forever in the next collective.

Without an initialised process group (or with one process) both are no-ops. torch and megatron-core
are imported only when a function here runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

from bridge_freeze_plugin.errors import BridgeFreezeError, UnclassifiedParameterError, UnsupportedFreezeFlagError
from bridge_freeze_plugin.freeze import as_chunks, iter_named_parameters
from bridge_freeze_plugin.guarantee import FreezeGuaranteeError
from bridge_freeze_plugin.registry import FamilySpec
from bridge_freeze_plugin.report import FreezeReport, PartCount, ordered_parts
from bridge_freeze_plugin.selection import Part

logger = logging.getLogger("bridge_freeze_plugin")

#: Where the last model-wide report of a provider is kept (``provider.__dict__``).
REPORT_ATTR = "_bridge_freeze_report"


class PeerRankFreezeError(BridgeFreezeError, RuntimeError):
    """Another rank failed while the model was built (with an error that is not one of the plugin's)."""


#: Error codes exchanged between ranks (0: no error). Order matters: first match wins.
_CODES: tuple[type[BaseException], ...] = (
    UnsupportedFreezeFlagError,
    UnclassifiedParameterError,
    FreezeGuaranteeError,
    BridgeFreezeError,
    Exception,
)


def _world() -> Any | None:
    """``torch.distributed`` when a process group with more than one rank is up, else ``None``."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist if dist.get_world_size() > 1 else None


def _code(error: BaseException | None) -> int:
    if error is None:
        return 0
    return next(i for i, kind in enumerate(_CODES, start=1) if isinstance(error, kind))


def agree_on_error(error: BaseException | None) -> None:
    """Make every rank raise if any rank has ``error``; call it on every rank at the same point.

    A rank with its own error re-raises it. A rank without one raises the same plugin error type as the
    lowest failing rank (:class:`PeerRankFreezeError` for any other exception), with that rank's message.
    One ``all_reduce`` over the world group; on failure, one broadcast of the message.
    """
    dist = _world()
    if dist is None:
        if error is not None:
            raise error
        return
    import torch

    rank, world = dist.get_rank(), dist.get_world_size()
    codes = torch.zeros(world, dtype=torch.int64)
    codes[rank] = _code(error)
    dist.all_reduce(codes)  # SUM: each rank fills its own slot
    failed = [r for r in range(world) if codes[r].item()]
    if not failed:
        return
    first = failed[0]
    message = [f"{type(error).__name__}: {error}" if rank == first else None]
    dist.broadcast_object_list(message, src=first)
    if error is not None:
        if hasattr(error, "add_note"):
            error.add_note(f"(raised on global rank {rank}; failing ranks: {failed})")
        raise error
    kind = _CODES[int(codes[first].item()) - 1]
    raised = kind if kind is not Exception and kind is not BridgeFreezeError else PeerRankFreezeError
    raise raised(
        f"global rank {first} (failing ranks: {failed} of {world}) raised while the model was built, so "
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


def collective_hook(chain: Callable[[Any], Any], after: Callable[[Any], None] | None = None) -> Callable[[Any], Any]:
    """A pre-wrap hook: ``chain`` (the plugin's hook chain), then :func:`agree_on_error`, then ``after``."""

    def bridge_freeze_collective_pre_wrap_hook(model: Any) -> Any:
        error: Exception | None = None
        try:
            out = chain(model)
            model = model if out is None else out
        except Exception as exc:  # noqa: BLE001  (any rank's failure must become every rank's)
            error = exc
        agree_on_error(error)
        if after is not None:
            after(model)
        return model

    return bridge_freeze_collective_pre_wrap_hook


# --------------------------------------------------------------------------------------------
# The model-wide report.
# --------------------------------------------------------------------------------------------


def _tp_rank(param: Any, parallel_state: Any) -> int:
    """This rank's index among the ranks that hold copies / shards of ``param`` along tensor parallel."""
    if not getattr(param, "allreduce", True):  # expert parameter: expert tensor parallel
        return int(parallel_state.get_expert_tensor_parallel_rank())
    return int(parallel_state.get_tensor_model_parallel_rank())


def _local_counts(model: Any, family: FamilySpec, parallel_state: Any) -> list[int]:
    """Per part: [trainable, total, trainable tensors, total tensors] this rank contributes."""
    parts = list(Part)
    counts = [0] * (4 * len(parts))
    dense_owner = parallel_state.get_data_parallel_rank(with_context_parallel=True) == 0
    expert_owner = parallel_state.get_expert_data_parallel_rank() == 0
    seen: set[int] = set()
    for _, name, param in iter_named_parameters(as_chunks(model)):
        if id(param) in seen:
            continue
        seen.add(id(param))
        if getattr(param, "shared", False):  # last stage's copy of a tied embedding / output weight
            continue
        if not (expert_owner if not getattr(param, "allreduce", True) else dense_owner):
            continue  # a data-parallel replica: counted by its replica 0
        first_tp = _tp_rank(param, parallel_state) == 0
        sharded = bool(getattr(param, "tensor_model_parallel", False))
        if not (sharded or first_tp):
            continue  # duplicated over tensor-parallel ranks: counted by tensor-parallel rank 0
        part = family.classify(name)
        base = 4 * parts.index(Part.OTHER if part is None else part)
        n = param.numel()
        counts[base + 1] += n
        counts[base + 3] += int(first_tp)  # a sharded tensor is one tensor of the model
        if param.requires_grad:
            counts[base] += n
            counts[base + 2] += int(first_tp)
    return counts


def model_wide_report(model: Any, local: FreezeReport, family: FamilySpec) -> FreezeReport:
    """The report of the whole model (all ranks' pieces, each counted once), from this rank's chunks.

    ``local`` gives the labels (provider, selection, overridden defaults); with no process group, or
    one process, it is returned unchanged. Every rank must call this at the same point.
    """
    dist = _world()
    if dist is None:
        return local
    import torch
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        logger.debug("bridge-freeze: no Megatron model-parallel state; the report covers this rank only")
        return local
    counts = torch.tensor(_local_counts(model, family, parallel_state), dtype=torch.int64)
    dist.all_reduce(counts)  # world group: the owners above make each parameter count once
    rows = counts.view(-1, 4).tolist()
    parts = {part: PartCount(part, *row) for part, row in zip(Part, rows, strict=True) if row[3]}
    return dataclasses.replace(local, parts=ordered_parts(parts))


def store_report(provider: Any, report: FreezeReport) -> None:
    provider.__dict__[REPORT_ATTR] = report


def last_report(provider: Any) -> FreezeReport | None:
    """The report of the provider's last build: model-wide after ``provide_distributed_model()`` (the same
    on every rank), the built chunk's after a plain ``provide()``; ``None`` before any build."""
    report = provider.__dict__.get(REPORT_ATTR)
    return report if isinstance(report, FreezeReport) else None
