"""The gradients of the audited steps: per trainable tensor, did it get one; per part, how large, model-wide.

Read right after a step's gradients are final (megatron-core's ``finalize_model_grads`` returned: data-parallel
reduce or reduce-scatter, the tensor- and pipeline-parallel all-reduces, the per-token scaling), before the
optimizer steps. A parameter's gradient is Megatron DDP's ``main_grad`` (a view of its gradient buffer), else
``.grad``. With the distributed optimizer each data-parallel rank holds the reduced values of its own shard of the
buffer only, so the norm sums each rank's shard (the rest of its buffer is its local, unreduced gradient); whether
a tensor got a gradient at all is the OR over its data- and tensor-parallel copies (:func:`merge_flags`), counted
once by its owner (:func:`~bridge_freeze_plugin.prewrap.ownership`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bridge_freeze_plugin.audit._watch import Tracked
from bridge_freeze_plugin.request import Part

#: The parts in the order of the model-wide vectors.
PARTS: tuple[Part, ...] = tuple(Part)


def grad_of(param: Any) -> Any | None:
    """The gradient the optimizer will read: Megatron DDP's ``main_grad``, else ``.grad``."""
    grad = getattr(param, "main_grad", None)
    return grad if grad is not None else param.grad


def ddp_layout(chunks: Sequence[Any]) -> tuple[set[int] | None, dict[int, Any]]:
    """(ids of the parameters in Megatron DDP's gradient buffers, or ``None`` when no chunk is Megatron DDP;
    id -> the flat view of the shard of its gradient this rank reduces, under the distributed optimizer)."""
    in_buffers: set[int] | None = None
    shards: dict[int, Any] = {}
    for chunk in chunks:
        buffers = [*(getattr(chunk, "buffers", None) or ()), *(getattr(chunk, "expert_parallel_buffers", None) or ())]
        groups = [*(getattr(chunk, "bucket_groups", None) or ()),
                  *(getattr(chunk, "expert_parallel_bucket_groups", None) or ())]
        if not hasattr(chunk, "buffers") and not groups:
            continue
        in_buffers = set() if in_buffers is None else in_buffers
        in_buffers.update(id(p) for buffer in buffers for p in getattr(buffer, "params", ()))
        for group in groups:
            if not getattr(getattr(group, "ddp_config", None), "use_distributed_optimizer", False):
                continue
            size = int(getattr(group, "intra_distributed_optimizer_instance_size", 1))
            rank = int(getattr(group, "intra_distributed_optimizer_instance_rank", 0))
            for bucket in group.buckets:
                width = bucket.grad_data.numel() // size
                low, high = rank * width, (rank + 1) * width
                for param, (start, end) in _bucket_index(bucket).items():
                    in_buffers.add(id(param))
                    lo, hi = max(start, low), min(end, high)
                    shards[id(param)] = bucket.grad_data[lo:hi] if lo < hi else bucket.grad_data[:0]
    return in_buffers, shards


def _bucket_index(bucket: Any) -> dict[Any, tuple[int, int]]:
    """param -> (start, end) in the bucket's ``grad_data`` (megatron-core 0.19's ``param_to_index``, else from the
    buffer-wide index every release keeps)."""
    index = getattr(bucket, "param_to_index", None)
    if index is not None:
        return dict(index)
    return {p: (s - bucket.offset, e - bucket.offset) for p, (s, e, _) in bucket.param_index_map.items()}


def _norms(tensors: list[Any], order: float) -> list[float]:
    """Each tensor's ``order``-norm (as floats), computed per device and dtype in fused kernels."""
    import torch

    out: list[float] = [0.0] * len(tensors)
    groups: dict[tuple[Any, Any], list[int]] = {}
    for i, tensor in enumerate(tensors):
        if tensor.numel():
            groups.setdefault((tensor.device, tensor.dtype), []).append(i)
    for indices in groups.values():
        values = torch.stack(torch._foreach_norm([tensors[i] for i in indices], order)).double().cpu().tolist()
        for i, value in zip(indices, values, strict=True):
            out[i] = value
    return out


@dataclass
class GradientTally:
    """The local record of the audited steps' gradients (merged over ranks by :mod:`._summary`)."""

    trainable: list[Tracked]
    in_buffers: set[int] | None = None
    shards: dict[int, Any] = field(default_factory=dict)
    #: per trainable tensor: a non-zero gradient in some audited step (this rank's copy / shard)
    flags: list[bool] = field(default_factory=list)
    #: per step, per part (:data:`PARTS`): the sum of squares this rank contributes to the part's gradient norm
    squares: list[list[float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.flags = [False] * len(self.trainable)

    @classmethod
    def start(cls, trainable: list[Tracked], chunks: Sequence[Any]) -> GradientTally:
        in_buffers, shards = ddp_layout(chunks)
        return cls(trainable, in_buffers, shards)

    def missing_from_buffers(self, tracked: Tracked) -> bool:
        return self.in_buffers is not None and id(tracked.param) not in self.in_buffers

    def add_step(self) -> None:
        """This step's gradients."""
        import torch

        grads = [grad_of(t.param) for t in self.trainable]
        with torch.no_grad():
            present = [i for i, g in enumerate(grads) if g is not None]
            peaks = _norms([grads[i] for i in present], float("inf"))
            for i, peak in zip(present, peaks, strict=True):
                self.flags[i] = self.flags[i] or peak > 0
            regions, owners = [], []
            for i in present:
                tracked = self.trainable[i]
                shard = self.shards.get(id(tracked.param))
                if shard is not None and tracked.shard_owner:
                    regions.append(shard)
                elif shard is None and tracked.counts_here:
                    regions.append(grads[i])
                else:
                    continue
                owners.append(i)
            row = [0.0] * len(PARTS)
            for i, norm in zip(owners, _norms(regions, 2.0), strict=True):
                part = self.trainable[i].part
                row[PARTS.index(part if part is not None else Part.OTHER)] += norm * norm
        self.squares.append(row)
