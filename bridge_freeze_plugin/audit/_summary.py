"""The audit's verdict, model-wide: each rank's record merged (the same :class:`AuditReport` on every rank).

Three exchanges, each over the groups that hold copies of the same tensors, in the same order on every rank:

1. whether each trainable tensor got a gradient: ``MAX`` over its tensor-parallel group, then over its
   data-parallel group (dense tensors: tensor- and data-parallel with context parallel; experts: expert tensor- and
   expert data-parallel), so a shard or a replica that saw a gradient counts;
2. per part: trainable tensors, those with a gradient, and each step's sum of squares, summed over the world with one
   owner per tensor (:func:`~bridge_freeze_plugin.prewrap.ownership`);
3. the names of the trainable tensors, and for those without a gradient the cause their owner saw, gathered to
   every rank (so a strict audit raises the same error everywhere).

Without a multi-rank process group the local record is the verdict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from bridge_freeze_plugin.audit._gradients import PARTS, GradientTally
from bridge_freeze_plugin.audit._report import AuditReport, Finding, PartAudit
from bridge_freeze_plugin.audit._watch import Tracked, Watch
from bridge_freeze_plugin.ranks import collective_device, world
from bridge_freeze_plugin.request import INFO, Part


def merge_flags(tally: GradientTally) -> list[bool]:
    """Each trainable tensor's flag, OR-ed over the ranks that hold a copy or a shard of it."""
    dist = world()
    flags = list(tally.flags)
    if dist is None:
        return flags
    import torch
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return flags
    kinds = (
        (False, (ps.get_tensor_model_parallel_group(), ps.get_data_parallel_group(with_context_parallel=True))),
        (True, (ps.get_expert_tensor_parallel_group(), ps.get_expert_data_parallel_group())),
    )
    for expert, groups in kinds:
        index = [i for i, t in enumerate(tally.trainable) if t.expert is expert]
        if not index:  # the same on every rank of these groups: they hold the same tensors
            continue
        for group in groups:
            if group is None or dist.get_world_size(group) == 1:
                continue
            values = torch.tensor([int(flags[i]) for i in index], dtype=torch.int64, device=collective_device(group))
            dist.all_reduce(values, op=dist.ReduceOp.MAX, group=group)
            for i, value in zip(index, values.cpu().tolist(), strict=True):
                flags[i] = bool(value)
    return flags


def _sum_over_world(values: list[float]) -> list[float]:
    dist = world()
    if dist is None:
        return values
    import torch

    tensor = torch.tensor(values, dtype=torch.float64, device=collective_device())
    dist.all_reduce(tensor)
    return tensor.cpu().tolist()


def _gather(items: list[Any]) -> list[Any]:
    dist = world()
    if dist is None:
        return items
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, items)
    return [item for part in out for item in part]


def _recompute_on(tracked: Tracked, chunks: Sequence[Any]) -> bool:
    """Whether full activation recompute is on in the config of a module above this parameter."""
    path = tracked.local.split(".")[:-1]
    chunk = chunks[tracked.chunk]
    for depth in range(len(path), 0, -1):
        try:
            module = chunk.get_submodule(".".join(path[:depth]))
        except AttributeError:
            continue
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "recompute_granularity"):
            return getattr(config, "recompute_granularity", None) == "full"
    return False


def cause_of(tracked: Tracked, tally: GradientTally, watch: Watch, flags: list[bool], chunks: Sequence[Any]) -> str:
    """What the audit can see of why a trainable tensor got no gradient (the keys of ``_report.CAUSES``; ``chunks``:
    the bare chunks, where the tensor's local name is found)."""
    if tally.missing_from_buffers(tracked):
        return "not_in_buffers"
    if not watch.part_ran(tracked.part):
        return "no_input"
    part = tracked.part
    if tracked.expert and (tracked.module not in watch.ran or any(
            f and t.expert and t.part == part for t, f in zip(tally.trainable, flags, strict=True))):
        return "routing"
    if tracked.module not in watch.ran:
        return "not_run"
    if _recompute_on(tracked, chunks):
        return "recompute"
    return "detached"


def _saving(trainable: int, chunks: Sequence[Any]) -> tuple[tuple[int, int], str]:
    """(gradient-buffer bytes, optimizer-state bytes) of ``trainable`` elements, as ``plan`` figures them."""
    config = getattr(chunks[0], "config", None)
    ddp = getattr(chunks[0], "ddp_config", None)
    params_dtype = str(getattr(config, "params_dtype", "torch.float32"))
    mixed = bool(getattr(config, "bf16", False) or getattr(config, "fp16", False)) or "float32" not in params_dtype
    grad = 4 if ddp is None or getattr(ddp, "grad_reduce_in_fp32", False) or not mixed else 2
    dp = 1
    if getattr(ddp, "use_distributed_optimizer", False) and world() is not None:
        from megatron.core import parallel_state as ps

        dp = ps.get_data_parallel_world_size(with_context_parallel=True)
    state = (4 if mixed else 0) + 8
    basis = (f"{grad} B of gradient per parameter; Adam: {'an fp32 master copy and ' if mixed else ''}two fp32 moments"
             f"{f', sharded over {dp} data-parallel ranks' if dp > 1 else ''}; the model-wide figures of plan")
    return (trainable * grad, math.ceil(trainable * state / dp)), basis


def summarize(audit: Any, chunks: Sequence[Any]) -> AuditReport:
    """The model-wide :class:`AuditReport` of a :class:`~._run.RunAudit` after its last audited step (``chunks``: the
    model as the step ran it, DDP-wrapped or not)."""
    tally: GradientTally = audit.tally
    watch: Watch = audit.watch
    flags = merge_flags(tally)
    steps = len(tally.squares)
    width = 2 + steps
    values = [0.0] * (len(PARTS) * width + 2)
    local: list[tuple[str, str, str]] = []
    for tracked, flag in zip(tally.trainable, flags, strict=True):
        row = PARTS.index(tracked.part if tracked.part is not None else Part.OTHER) * width
        if tracked.counts_here and tracked.first_shard:
            values[row] += 1
            values[row + 1] += int(flag)
            part = tracked.part.value if tracked.part is not None else Part.OTHER.value
            cause = "" if flag else cause_of(tracked, tally, watch, flags, audit.chunks)
            local.append((part, cause, tracked.name))
    for step, squares in enumerate(tally.squares):
        for i, square in enumerate(squares):
            values[i * width + 2 + step] += square
    values[-2], values[-1] = audit.held_counts()
    merged = _sum_over_world(values)
    parts = []
    for i, part in enumerate(PARTS):
        row = merged[i * width : (i + 1) * width]
        if part in audit.report_parts or row[0]:
            parts.append(PartAudit(part, int(row[0]), int(row[1]), tuple(math.sqrt(max(v, 0.0)) for v in row[2:])))
    grouped: dict[tuple[str, str], list[str]] = {}
    learned: list[str] = []
    for part_name, cause, name in sorted(_gather(local)):
        if cause:
            grouped.setdefault((part_name, cause), []).append(name)
        else:
            learned.append(name)
    findings = []
    for (part_name, cause), names in grouped.items():
        part = Part(part_name)
        saving, basis = None, ""
        if cause == "no_input" and part in INFO:
            saving, basis = _saving(audit.build_report.part(part).trainable, chunks)
        findings.append(Finding(None if part is Part.OTHER else part, cause, tuple(names), saving, basis))
    return AuditReport(
        provider=audit.context.provider_label, family=audit.build_report.family, model_name=audit.context.model_name,
        steps=steps, parts=tuple(parts), findings=tuple(findings), learned=tuple(sorted(learned)),
        held_tensors=int(merged[-2]),
        held_buffers=int(merged[-1]), held_through=max(steps - 1, 0), zero_lr_parts=watch.zero_lr_parts,
        strict=audit.settings.strict, seconds=audit.seconds,
    )
