"""On a GPU: the selection survives the real path (CUDA placement, Float16Module bf16, Megatron DDP with the
distributed optimizer) and DDP's gradient buffers and the optimizer's state hold exactly the trainable parameters.
Skipped without CUDA (tests/gpu/conftest.py)."""

from __future__ import annotations

import math
import re

import pytest

pytestmark = pytest.mark.gpu

FAMILY = "qwen3_vl"
# Independent of the plugin's registry: Qwen3-VL's parts by Megatron parameter name.
PROJECTION = re.compile(r"^(module\.)*vision_model\.(merger|decoder\.deepstack_merger_list)\.")
VISION = re.compile(r"^(module\.)*vision_model\.")
SELECTIONS = {
    "projection only": ({"freeze_language_model": True, "freeze_vision_model": True},
                        lambda n: bool(PROJECTION.match(n))),
    "LM frozen": ({"freeze_language_model": True}, lambda n: bool(VISION.match(n))),
    "vision side frozen": ({"freeze_vision_model": True, "freeze_vision_projection": True},
                           lambda n: not VISION.match(n)),
}


def _train(flags, distributed_optimizer=True, steps=3):
    from bridge_freeze_harness.ddp_steps import build_ddp_chunks, megatron_optimizer, to_cuda, train_ddp
    from bridge_freeze_harness.train import make_provider, synthetic_batch, train_spec
    from bridge_freeze_plugin import FreezeSelection, make_freezable

    provider = make_freezable(make_provider(FAMILY, "cuda"), FreezeSelection(**flags))
    chunks = build_ddp_chunks(provider, FAMILY, distributed_optimizer=distributed_optimizer)
    optimizer = megatron_optimizer(chunks, lr=1e-3, distributed_optimizer=distributed_optimizer)
    batch = to_cuda(synthetic_batch(FAMILY, provider, batch_size=2))
    return chunks, train_ddp(chunks, optimizer, batch, FAMILY, train_spec(FAMILY), steps)


@pytest.mark.parametrize("selection", sorted(SELECTIONS))
def test_ddp_buffers_and_optimizer_state_hold_exactly_the_trainable_parameters_on_cuda(cuda_world, selection):
    flags, trains = SELECTIONS[selection]
    chunks, run = _train(flags)
    expected = {n for n in run.names if trains(n)}
    assert expected and set(run.trainable) == expected
    assert set(run.in_buffers) == expected
    assert run.trainable_on_cuda
    elements = sum(p.numel() for c in chunks for n, p in c.named_parameters() if n in expected)
    assert run.grad_bytes_unpadded == 4 * elements  # fp32 main grads (grad_reduce_in_fp32)
    assert run.optimizer_state_bytes == 8 * elements  # exp_avg + exp_avg_sq in fp32, trainable only
    assert all(math.isfinite(loss) for loss in run.losses)


def test_frozen_weights_do_not_move_under_ddp_on_cuda(cuda_world):
    import torch

    flags, trains = SELECTIONS["projection only"]
    from bridge_freeze_harness.ddp_steps import build_ddp_chunks, megatron_optimizer, to_cuda, train_ddp
    from bridge_freeze_harness.train import make_provider, synthetic_batch, train_spec
    from bridge_freeze_plugin import FreezeSelection, make_freezable

    provider = make_freezable(make_provider(FAMILY, "cuda"), FreezeSelection(**flags))
    chunks = build_ddp_chunks(provider, FAMILY, distributed_optimizer=False)
    before = {n: p.detach().clone() for c in chunks for n, p in c.named_parameters()}
    batch = to_cuda(synthetic_batch(FAMILY, provider, batch_size=2))
    train_ddp(chunks, megatron_optimizer(chunks, lr=1e-2, distributed_optimizer=False), batch, FAMILY,
              train_spec(FAMILY), steps=2)
    after = {n: p.detach() for c in chunks for n, p in c.named_parameters()}
    moved = {n for n in after if not torch.equal(after[n], before[n])}
    assert moved == {n for n in after if trains(n)}
