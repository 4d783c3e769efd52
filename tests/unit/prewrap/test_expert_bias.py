"""A frozen MoE router's expert bias stays frozen (megatron-core updates it without a gradient).

megatron-core's ``finalize_model_grads`` moves every router's ``expert_bias`` buffer after each step from the token
counts (``_update_router_expert_bias``), whether or not the router trains, unless the router's
``frozen_expert_bias`` is set: with ``freeze_language_model=True`` on GLM-4.5V, Kimi K2.5 or ERNIE-4.5-VL, the
language model's routing still changed. Real tiny builds; the update is megatron-core's own function.
"""

from __future__ import annotations

import pytest
import torch

import bridge_freeze_plugin as bfp
from bridge_freeze_harness import train
from bridge_freeze_harness.tiny import build_tiny_chunks


def _routers(chunk):
    return {n: m for n, m in chunk.named_modules() if getattr(m, "expert_bias", None) is not None}


@pytest.mark.parametrize("family", ["glm45v", "ernie45_vl"])
@pytest.mark.parametrize("freeze_lm", [True, False], ids=["lm-frozen", "lm-trains"])
def test_expert_bias_moves_only_where_the_router_trains(cpu_bridge, family, freeze_lm):
    from megatron.core.distributed.finalize_model_grads import _update_router_expert_bias

    provider = bfp.make_freezable(train.make_provider(family, moe_router_bias_update_rate=1e-3),
                                  bfp.FreezeSelection(freeze_language_model=freeze_lm))
    (chunk,) = build_tiny_chunks(family, provider=provider)
    chunk.train()
    routers = _routers(chunk)
    assert routers and all(n.startswith("language_model.") for n in routers)
    assert {n for n, m in routers.items() if m.frozen_expert_bias} == (set(routers) if freeze_lm else set())
    before = {n: m.expert_bias.clone() for n, m in routers.items()}
    train.forward_backward(chunk, train.synthetic_batch(family, provider), family)
    for module in routers.values():  # uneven counts, so an update cannot be zero by chance (tiny batches tie)
        counts = module.local_tokens_per_expert
        counts.copy_(torch.arange(counts.numel(), dtype=counts.dtype))
    _update_router_expert_bias([chunk], chunk.config)
    moved = {n for n, m in routers.items() if not torch.equal(m.expert_bias, before[n])}
    assert moved == (set() if freeze_lm else set(routers))
