"""The bytes of one checkpoint save, full and trainable-only (issue 45 item 4): ``bridge-freeze plan``'s
"per save" line.

Pure arithmetic over a :class:`~bridge_freeze_plugin.planning._estimate.Plan`. What a Megatron-Bridge
``torch_dist`` save writes, as megatron-core 0.19 lays it out:

- **weights**: every parameter in ``param_dtype`` (a full save), or only the trainable ones (a checkpoint of what
  trains: the frozen base comes from ``checkpoint.pretrained_checkpoint``, as a PEFT run's does);
- **optimizer state**, the same in both: per trainable parameter the fp32 main parameter and the optimizer's state
  tensors (Adam's ``exp_avg`` and ``exp_avg_sq``, SGD's momentum) in ``state_dtype``. The distributed optimizer
  always saves its fp32 main parameters (its ``param`` entry, fp32 weights included); the plain optimizer only
  with mixed precision (``fp32_param``). Frozen parameters have none.

Not counted: the RNG states, the scheduler and the train state (kilobytes), the ``run_config.yaml``, padding of the
distributed optimizer's buckets. ``in all`` is the checkpoint on disk (a tensor replicated over data-parallel ranks is
written once); ``per rank`` is what the largest rank position holds of it: its model-parallel shard of the weights
and its own optimizer state (its distributed-optimizer shard). Nothing here is measured: it follows the plan's
counts and assumptions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: the bytes of one fp32 element: the main parameters a save holds beside the optimizer's state
_FP32_BYTES = 4


@dataclass(frozen=True)
class SaveBytes:
    """One save's bytes: all weights, the trainable weights, and the optimizer state (of the trainable ones)."""

    weights: int
    trainable_weights: int
    optimizer: int

    @property
    def full(self) -> int:
        return self.weights + self.optimizer

    @property
    def trainable_only(self) -> int:
        return self.trainable_weights + self.optimizer

    def as_dict(self) -> dict[str, int]:
        return {"weight_bytes": self.weights, "trainable_weight_bytes": self.trainable_weights,
                "optimizer_bytes": self.optimizer, "full_bytes": self.full, "trainable_only_bytes": self.trainable_only}


@dataclass(frozen=True)
class SaveSize:
    """One checkpoint save of a plan: in all, and on its largest rank position (``rank``: (tp, pp, ep))."""

    in_all: SaveBytes
    per_rank: SaveBytes | None
    rank: tuple[int, int, int] | None
    #: bytes saved per trainable parameter for the optimizer (fp32 main parameter + state tensors)
    optimizer_bytes_per_param: int
    distributed_optimizer: bool
    counted: str

    def as_dict(self) -> dict[str, Any]:
        return {"in_all": self.in_all.as_dict(),
                "per_rank": None if self.per_rank is None else self.per_rank.as_dict(),
                "rank": None if self.rank is None else dict(zip(("tp", "pp", "ep"), self.rank, strict=True)),
                "optimizer_bytes_per_trainable_param": self.optimizer_bytes_per_param,
                "distributed_optimizer": self.distributed_optimizer, "counted": self.counted}


def saved_optimizer_bytes(assumptions: Any, distributed: bool) -> int:
    """Optimizer bytes a save holds per trainable parameter (see the module docstring)."""
    main = _FP32_BYTES if distributed or assumptions.master_bytes else 0
    return main + assumptions.state_bytes


def save_size(plan: Any) -> SaveSize:
    """The bytes of one checkpoint save of ``plan`` (its counts, assumptions, layout and per-rank figures)."""
    a = plan.assumptions
    distributed = bool(getattr(plan.layout, "use_distributed_optimizer", False)) or a.dp_size > 1
    per_param = saved_optimizer_bytes(a, distributed)
    total = plan.total.count
    in_all = SaveBytes(total.total * a.param_bytes, total.trainable * a.param_bytes, total.trainable * per_param)
    largest = plan.largest_rank()
    per_rank = rank = None
    if largest is not None:
        # the elements this rank keeps optimizer state for: its distributed-optimizer shard, else all it trains
        elements = largest.optimizer_bytes // a.optimizer_bytes if a.optimizer_bytes else largest.trainable
        per_rank = SaveBytes(largest.parameters * a.param_bytes, largest.trainable * a.param_bytes,
                             elements * per_param)
        rank = (largest.tp, largest.pp, largest.ep)
    main = "fp32 main parameters + " if per_param > a.state_bytes else ""
    state = "exp_avg + exp_avg_sq" if a.optimizer == "adam" else "momentum"
    counted = (f"{a.param_dtype} weights; optimizer state of the trainable parameters only: {main}{a.state_dtype} "
               f"{state} ({per_param} B each, {'distributed' if distributed else 'plain'} optimizer); not counted: "
               "RNG, scheduler and train state, bucket padding")
    return SaveSize(in_all, per_rank, rank, per_param, distributed, counted)


def save_lines(size: SaveSize, human: Any) -> list[str]:
    """``plan``'s text lines for ``size`` (``human``: bytes -> text)."""
    def said(b: SaveBytes) -> str:
        return (f"{human(b.trainable_weights)} + optimizer {human(b.optimizer)} instead of {human(b.weights)} + "
                f"optimizer {human(b.optimizer)} ({human(b.trainable_only)} instead of {human(b.full)})")

    lines = [f"per checkpoint save, trainable-only (the frozen base as pretrained_checkpoint) vs full: in all "
             f"{said(size.in_all)}"]
    if size.per_rank is not None and size.per_rank != size.in_all:
        tp, pp, ep = size.rank or (0, 0, 0)
        lines.append(f"  per rank (the largest, tp {tp} pp {pp} ep {ep}): {said(size.per_rank)}")
    lines.append(f"  (counted: {size.counted})")
    return lines
