"""On a GPU: the selection survives the real path (CUDA placement, Float16Module, DDP wrap), and the
DDP gradient buffers hold exactly the trainable parameters. Skipped without CUDA (tests/gpu/conftest.py)."""

from __future__ import annotations

import os
import re

import pytest

pytestmark = pytest.mark.gpu

PROJECTION = re.compile(r"^(module\.)*vision_model\.(merger|decoder\.deepstack_merger_list)\.")


@pytest.fixture(scope="module")
def nccl_world():
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from bridge_freeze_harness.cpu_runtime import free_port, import_bridge

    import_bridge()
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)
    yield


def test_projection_only_qwen3_vl_through_ddp_on_cuda(nccl_world):
    from megatron.core.distributed import DistributedDataParallelConfig

    import bridge_freeze_plugin  # noqa: F401  (activation)
    from bridge_freeze_harness.tiny import family_module
    from bridge_freeze_plugin import FreezeSelection, make_freezable

    provider = make_freezable(
        family_module("qwen3_vl").make_provider(use_cpu_initialization=False),
        FreezeSelection(freeze_language_model=True, freeze_vision_model=True),
    )
    chunks = provider.provide_distributed_model(
        ddp_config=DistributedDataParallelConfig(use_distributed_optimizer=False), bf16=True
    )
    wrapped = chunks[0]
    names = {n for n, _ in wrapped.named_parameters()}
    trainable = {n for n, p in wrapped.named_parameters() if p.requires_grad}
    assert trainable == {n for n in names if PROJECTION.match(n)}
    in_buffers = {id(p) for buf in wrapped.buffers for p in buf.params}
    assert in_buffers == {id(p) for _, p in wrapped.named_parameters() if p.requires_grad}
    assert all(p.is_cuda for p in wrapped.parameters() if p.requires_grad)
