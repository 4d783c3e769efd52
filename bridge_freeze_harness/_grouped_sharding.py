"""The torch_dist layout of the CPU grouped-expert stand-in: the sharded keys TE's grouped GEMM writes.

megatron-core's ``TEGroupedMLP.sharded_state_dict`` (``transformer/moe/experts.py``) asks each of its
``linear_fc1`` / ``linear_fc2`` for a sharded state dict under ``linear_fc<n>.``, applies the SwiGLU split to
``linear_fc1.weight<i>`` and renames the prefix to ``experts.linear_fc<n>.``. TransformerEngine's grouped linear
answers with, per local expert ``i``, its ``weight<i>`` (and ``bias<i>``) as ONE sharded tensor per linear,
``<prefix>weight`` / ``<prefix>bias``, with the expert-parallel offset ``(axis, global expert index,
number of global experts)`` added, split over the expert tensor-parallel group along axis 0 (column) or
axis 1 (row; a row bias is not split), and the data-parallel part of its replica id taken in the expert
data-parallel group. :func:`grouped_sharded_state_dict` builds the same (our own code; nothing copied): a
torch_dist checkpoint written on the CPU has the sharded keys and global shapes of a GPU run's, so either
loads the other's expert weights. What this stand-in does not write is TE's per-GEMM ``_extra_state``
(FP8 metadata, a ``ShardedObject``; no FP8 here).
"""

from __future__ import annotations

from typing import Any

import torch


def _tp_axes(parallel_mode: str, index: int, use_bias: bool) -> dict[str, int]:
    """Which local key is split over tensor parallelism, along which axis (TE's column / row convention)."""
    if parallel_mode == "column":
        return {f"{index}.weight": 0, **({f"{index}.bias": 0} if use_bias else {})}
    return {f"{index}.weight": 1}


def grouped_sharded_state_dict(
    module: Any, parallel_mode: str, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None,
) -> dict[str, Any]:
    """``module``'s ``weight<i>`` / ``bias<i>`` as ShardedTensors keyed as TE's ``TEGroupedLinear`` keys them.

    ``module``: a grouped linear with ``num_gemms`` and ``use_bias``; ``parallel_mode``: ``"column"`` or ``"row"``.
    """
    from megatron.core import parallel_state
    from megatron.core.dist_checkpointing.utils import replace_prefix_for_sharding
    from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group, make_sharded_tensors_for_checkpoint

    metadata = ensure_metadata_has_dp_cp_group(metadata)
    singleton = bool(metadata.get("singleton_local_shards", False))
    ep_size = parallel_state.get_expert_model_parallel_world_size()
    first_expert = parallel_state.get_expert_model_parallel_rank() * module.num_gemms
    edp_rank = parallel_state.get_expert_data_parallel_rank()
    tp_group = parallel_state.get_expert_tensor_parallel_group()
    result: dict[str, Any] = {}
    for i in range(module.num_gemms):
        expert = first_expert + i
        local: dict[str, torch.Tensor] = {f"{i}.weight": getattr(module, f"weight{i}")}
        if module.use_bias:
            local[f"{i}.bias"] = getattr(module, f"bias{i}")
        offsets = tuple(sharded_offsets) if singleton else (
            *sharded_offsets, (len(sharded_offsets), expert, ep_size * module.num_gemms))
        sharded = make_sharded_tensors_for_checkpoint(
            local, "", _tp_axes(parallel_mode, i, module.use_bias), offsets, tp_group=tp_group,
            dp_cp_group=metadata["dp_cp_group"])
        replace_prefix_for_sharding(sharded, f"{i}.", f"{expert}.{prefix}" if singleton else prefix)
        for kind in ("weight", "bias"):
            if f"{i}.{kind}" in sharded:
                tensor = sharded[f"{i}.{kind}"]
                tensor.replica_id = (*tensor.replica_id[:2], edp_rank)
                result[f"{prefix}{kind}{i}"] = tensor
    return result
