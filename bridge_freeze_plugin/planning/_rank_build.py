"""One rank of a parallel layout, built for real on the meta device: the fake world it joins, the provider set up
for the layout, and megatron-core's gradient buffers over its chunks (:mod:`.per_rank` says why and how the plan
uses them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from bridge_freeze_plugin.errors import PlanError
from bridge_freeze_plugin.planning._layout import Layout
from bridge_freeze_plugin.planning._layout_fit import check_layout_fits

# --- the fake world --------------------------------------------------------------------------------------


@contextlib.contextmanager
def fake_world(layout: Layout, rank: int) -> Iterator[dict[str, int]]:
    """This process as ``rank`` of a ``layout.world_size``-rank ``fake``-backend world with the layout's
    model-parallel state; yields the rank's coordinates; restores the single-process gloo world after."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import random as mpu_random

    # Registers the "fake" backend: collectives return at once, no peer needed (PyTorch's own test utility).
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from bridge_freeze_harness.cpu_runtime import destroy_cpu_distributed, init_cpu_distributed

    destroy_cpu_distributed()
    try:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=layout.world_size)
        ps.initialize_model_parallel(
            tensor_model_parallel_size=layout.tp,
            pipeline_model_parallel_size=layout.pp,
            virtual_pipeline_model_parallel_size=layout.vp,
            expert_model_parallel_size=layout.ep,
            expert_tensor_parallel_size=layout.expert_tp,
            create_gloo_process_groups=False,  # gloo groups cannot form over the fake store
        )
        mpu_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
        yield {
            "tp": ps.get_tensor_model_parallel_rank(),
            "pp": ps.get_pipeline_model_parallel_rank(),
            "ep": ps.get_expert_model_parallel_rank(),
            "dp": ps.get_data_parallel_rank(),
        }
    finally:
        destroy_cpu_distributed()
        init_cpu_distributed()


def representative_rank(layout: Layout, pp_rank: int, ep_rank: int) -> int:
    """A global rank at pipeline stage ``pp_rank`` and expert-parallel rank ``ep_rank`` (megatron-core's
    default order: tensor-parallel ranks fastest, then expert / data parallel, pipeline slowest)."""
    return pp_rank * (layout.world_size // layout.pp) + ep_rank * layout.expert_tp


@contextlib.contextmanager
def _tensor_cuda_is_identity() -> Iterator[None]:
    """megatron-core ties the embedding across pipeline stages with ``weight.data.cuda()`` and an all-reduce
    (language_module.setup_embeddings_and_output_layer); on the meta device ``.cuda()`` must leave it there."""
    import torch

    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.Tensor.cuda = original  # type: ignore[assignment]


def _configure(provider: Any, layout: Layout) -> None:
    fields = {
        "tensor_model_parallel_size": layout.tp,
        "pipeline_model_parallel_size": layout.pp,
        "virtual_pipeline_model_parallel_size": layout.vp,
        "expert_model_parallel_size": layout.ep,
        "expert_tensor_parallel_size": layout.expert_tp,
        "context_parallel_size": 1,
        "num_layers_in_first_pipeline_stage": layout.first_stage_layers,
        "num_layers_in_last_pipeline_stage": layout.last_stage_layers,
        # megatron-core requires it for MoE with TP > 1; it only sets an attribute on parameters
        "sequence_parallel": layout.tp > 1,
    }
    for name, value in fields.items():
        if hasattr(provider, name):
            setattr(provider, name, value)
    if layout.pp > 1 and getattr(provider, "pipeline_dtype", None) is None:
        provider.pipeline_dtype = provider.params_dtype
    check_layout_fits(provider, layout)  # what megatron-core would assert, bare, while building a layer
    try:
        provider.finalize()
    except Exception as exc:  # megatron-core / Bridge refuse this layout for this model
        from bridge_freeze_plugin.planning._model_choice import error_line

        hint = ""
        if "divisible by" in str(exc) and "pipeline" in str(exc):
            hint = (": give the first / last stage their own layer count with --decoder-first-pipeline-num-layers "
                    "/ --decoder-last-pipeline-num-layers, or another --pp")
        raise PlanError(f"{layout.describe()} does not fit this model: {error_line(exc)}{hint}") from exc
    provider.sequence_parallel = False  # local norms refuse it; no parameter depends on it


@contextlib.contextmanager
def _one_rank_of_many() -> Iterator[None]:
    """The plugin's two model-wide verdicts (every selected part has parameters somewhere; every pattern
    matches somewhere) need the counts of all ranks, which a fake world's all-reduce does not bring: a rank
    alone would be refused for holding no vision encoder. The plan's whole-model build already gave both
    verdicts for the same selection; here they are skipped. Every per-rank check stays."""
    from bridge_freeze_plugin.prewrap import model_wide_checks_skipped

    with model_wide_checks_skipped():
        yield


def build_rank(provider: Any, layout: Layout, rank: int, build_context: Callable[[], Any]) -> tuple[dict, list]:
    """The rank's coordinates and its bare model chunks, built by ``provide_distributed_model`` on meta."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    with fake_world(layout, rank) as coords, build_context(), _tensor_cuda_is_identity(), _one_rank_of_many():
        provider._pg_collection = ProcessGroupCollection.use_mpu_process_groups()
        chunks = provider.provide_distributed_model(
            wrap_with_ddp=False, use_cpu_initialization=True, init_model_with_meta_device=True,
            mixed_precision_wrapper=None,
        )
        buffers = _ddp_buffers(chunks, layout) if any(
            p.requires_grad for c in chunks for p in c.parameters()) else []
    return coords, [chunks, buffers]


# --- megatron-core's gradient buffers and the distributed optimizer's shards ---------------------------------


@dataclass(frozen=True)
class _Buffer:
    numel: int  # padded: what the gradient buffer allocates
    dp: int  # the data-parallel group the distributed optimizer shards it over
    buckets: tuple[tuple[int, int], ...]  # (start, end) of each bucket in the buffer
    params: tuple[tuple[int, int], ...]  # (start, end) of each parameter in the buffer

    def max_shard_elements(self) -> int:
        """The most parameter elements one data-parallel rank's optimizer shard covers."""
        owned = [0] * self.dp
        for start, end in self.buckets:
            size = (end - start) // self.dp
            for i in range(self.dp):
                lo, hi = start + i * size, start + (i + 1) * size
                owned[i] += sum(max(0, min(hi, p1) - max(lo, p0)) for p0, p1 in self.params)
        return max(owned)


def _ddp_buffers(chunks: list, layout: Layout) -> list[_Buffer]:
    """megatron-core's ``DistributedDataParallel`` over each chunk, its buffers allocated on the meta device."""
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    config = DistributedDataParallelConfig(
        use_distributed_optimizer=layout.use_distributed_optimizer, grad_reduce_in_fp32=True,
        overlap_grad_reduce=False, bucket_size=None,
    )
    original = torch.cuda.current_device
    torch.cuda.current_device = lambda: "meta"  # type: ignore[assignment]  # the buffers' device
    out = []
    try:
        for chunk in chunks:
            # a part some providers build off the meta device (EXAONE 4.5's vision tower and merger, on the CPU):
            # moved to meta, shapes, dtypes and requires_grad kept; the distributed optimizer's parameter buffer,
            # on meta, cannot take a CPU parameter's data ("incompatible tensor type")
            if any(p.device.type != "meta" for p in chunk.parameters()):
                chunk.to("meta")
            ddp = DistributedDataParallel(config=chunk.config, ddp_config=config, module=chunk)
            for buffer in [*ddp.buffers, *ddp.expert_parallel_buffers]:
                buckets = tuple((b.offset, b.offset + b.grad_data.numel()) for b in buffer.buckets)
                params = tuple((s, e) for s, e, _ in buffer.param_index_map.values())
                out.append(_Buffer(int(buffer.numel), int(buffer.data_parallel_world_size), buckets, params))
    finally:
        torch.cuda.current_device = original  # type: ignore[assignment]
    return out
