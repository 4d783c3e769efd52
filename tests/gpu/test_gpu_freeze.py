"""On a GPU: the selection survives the real path (CUDA placement, Float16Module, DDP wrap), and the
DDP gradient buffer holds exactly the trainable parameters."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.gpu

QWEN3_PROJECTION = re.compile(r"^(module\.)*vision_model\.(merger|decoder\.deepstack_merger_list)\.")


def test_projection_only_qwen3_vl_through_ddp_on_cuda():
    import torch
    from megatron.core.distributed import DistributedDataParallelConfig

    from bridge_freeze_plugin import FreezeSelection, make_freezable
    from bridge_freeze_testing.tiny import make_provider

    provider = make_freezable(
        make_provider("qwen3_vl"), FreezeSelection(freeze_language_model=True, freeze_vision_model=True)
    )
    provider.bf16 = True
    chunks = provider.provide_distributed_model(
        ddp_config=DistributedDataParallelConfig(use_distributed_optimizer=False), bf16=True
    )
    wrapped = chunks[0]
    names = {n for n, _ in wrapped.named_parameters()}
    trainable = {n for n, p in wrapped.named_parameters() if p.requires_grad}
    assert trainable == {n for n in names if QWEN3_PROJECTION.match(n)}
    in_buffers = {id(p) for buf in wrapped.buffers for p in buf.params}
    assert in_buffers == {id(p) for _, p in wrapped.named_parameters() if p.requires_grad}
    assert all(p.is_cuda for p in wrapped.parameters() if p.requires_grad)
    torch.cuda.synchronize()
