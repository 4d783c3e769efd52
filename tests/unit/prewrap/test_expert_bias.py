"""A frozen MoE router's expert bias stays frozen (megatron-core updates it without a gradient).

megatron-core's ``finalize_model_grads`` moves every router's ``expert_bias`` buffer after each step from the token
counts (``_update_router_expert_bias``), whether or not the router trains, unless the router's
``frozen_expert_bias`` is set: with ``freeze_language_model=True`` on GLM-4.5V, Kimi K2.5 or ERNIE-4.5-VL, the
language model's routing still changed. megatron-core 0.18 (SkyRL 0.4.0's pin) has no ``frozen_expert_bias``:
there the freeze sets ``moe_router_bias_update_rate`` to 0 when every router is frozen, and refuses a selection that
freezes some routers and trains others. Real tiny builds; the update is megatron-core's own function, given the
config ``finalize_model_grads`` reads (``get_model_config(model[0])``).
"""

from __future__ import annotations

import logging

import pytest
import torch
from _family_parts import part_of

import bridge_freeze_plugin as bfp
from bridge_freeze_harness import train
from bridge_freeze_harness.tiny import build_tiny_chunks

RATE = 1e-3


def _routers(chunk):
    return {n: m for n, m in chunk.named_modules() if getattr(m, "expert_bias", None) is not None}


def _build(family, **selection):
    provider = bfp.make_freezable(train.make_provider(family, moe_router_bias_update_rate=RATE),
                                  bfp.FreezeSelection(**selection))
    (chunk,) = build_tiny_chunks(family, provider=provider)
    chunk.train()
    return provider, chunk


def _moved_by_an_update(family, provider, chunk):
    """One forward / backward, then megatron-core's expert-bias update as ``finalize_model_grads`` makes it: the
    routers whose bias changed (compared bit for bit)."""
    from megatron.core.distributed.finalize_model_grads import _update_router_expert_bias
    from megatron.core.utils import get_model_config

    routers = _routers(chunk)
    train.forward_backward(chunk, train.synthetic_batch(family, provider), family)
    for module in routers.values():  # uneven counts, so an update cannot be zero by chance (tiny batches tie)
        counts = module.local_tokens_per_expert
        counts.copy_(torch.arange(counts.numel(), dtype=counts.dtype))
        module.expert_bias.copy_(torch.linspace(-1, 1, module.expert_bias.numel()))  # not zeros: x + 0.0 is x
    before = {n: m.expert_bias.clone() for n, m in routers.items()}
    _update_router_expert_bias([chunk], get_model_config(chunk))
    return {n for n, m in routers.items() if not torch.equal(m.expert_bias.view(torch.int32),
                                                             before[n].view(torch.int32))}


def _has_frozen_expert_bias(routers) -> bool:
    return all(hasattr(m, "frozen_expert_bias") for m in routers.values())


@pytest.mark.parametrize("family", ["glm45v", "ernie45_vl"])
@pytest.mark.parametrize("freeze_lm", [True, False], ids=["lm-frozen", "lm-trains"])
def test_expert_bias_moves_only_where_the_router_trains(cpu_bridge, family, freeze_lm):
    provider, chunk = _build(family, freeze_language_model=freeze_lm)
    routers = _routers(chunk)
    assert routers and all(n.startswith("language_model.") for n in routers)
    if _has_frozen_expert_bias(routers):  # megatron-core 0.19+: the router's own switch, the rate as configured
        assert {n for n, m in routers.items() if m.frozen_expert_bias} == (set(routers) if freeze_lm else set())
        assert chunk.config.moe_router_bias_update_rate == RATE
    else:  # megatron-core 0.18 (the SkyRL lane): no switch; every router frozen, so no bias may move
        assert chunk.config.moe_router_bias_update_rate == (0.0 if freeze_lm else RATE)
    assert _moved_by_an_update(family, provider, chunk) == (set() if freeze_lm else set(routers))


@pytest.fixture
def routers_of_megatron_core_0_18(monkeypatch):
    """megatron-core 0.18's TopKRouter (SkyRL 0.4.0's pin) has no ``frozen_expert_bias``: removed where it exists."""
    from megatron.core.transformer.moe.router import TopKRouter

    init = TopKRouter.__init__

    def init_without_the_switch(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.__dict__.pop("frozen_expert_bias", None)

    monkeypatch.setattr(TopKRouter, "__init__", init_without_the_switch)


def _trainable(chunk):
    return {n for n, p in chunk.named_parameters() if p.requires_grad}


def test_all_routers_frozen_without_the_switch_stops_the_update(cpu_bridge, routers_of_megatron_core_0_18, caplog):
    with caplog.at_level(logging.INFO, logger="bridge_freeze_plugin"):
        provider, chunk = _build("ernie45_vl", freeze_language_model=True)
    routers = _routers(chunk)
    assert routers and not _has_frozen_expert_bias(routers)
    names = [n for n, _ in chunk.named_parameters()]
    assert _trainable(chunk) == {n for n in names if part_of("ernie45_vl", n) != "language_model"}
    assert chunk.config.moe_router_bias_update_rate == 0.0
    assert all(m.config.moe_router_bias_update_rate == 0.0 for m in routers.values())  # a copy of the provider
    said = [r for r in caplog.records if "moe_router_bias_update_rate" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    assert f"all {len(routers)} MoE router(s)" in said[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "expert" in r.getMessage()]
    assert _moved_by_an_update("ernie45_vl", provider, chunk) == set()


def test_some_routers_frozen_without_the_switch_is_refused(cpu_bridge, routers_of_megatron_core_0_18):
    pattern = r"language_model\..*\.vision_moe_layer\.router\.weight"
    with pytest.raises(bfp.InvalidFreezeConfigError) as raised:
        _build("ernie45_vl", freeze_patterns=(pattern,))
    message = str(raised.value)
    assert f"freeze_patterns=[{pattern!r}] on Ernie45VLModelProvider" in message
    assert "freezes 1 MoE router(s) with an expert bias (language_model.decoder.layers.1.mlp.vision_moe_layer" \
           ".router)" in message
    assert "1 other router(s) train (e.g. language_model.decoder.layers.1.mlp.text_moe_layer.router)" in message
    for fix in ("Freeze or train all routers alike", "moe_router_bias_update_rate=0 on the provider",
                "megatron-core 0.19 or newer"):
        assert fix in message


def test_no_router_frozen_without_the_switch_leaves_the_rate(cpu_bridge, routers_of_megatron_core_0_18, caplog):
    with caplog.at_level(logging.INFO, logger="bridge_freeze_plugin"):
        provider, chunk = _build("ernie45_vl", freeze_vision_model=True)
    routers = _routers(chunk)
    names = [n for n, _ in chunk.named_parameters()]
    assert _trainable(chunk) == {n for n in names if part_of("ernie45_vl", n) != "vision_model"}
    assert chunk.config.moe_router_bias_update_rate == RATE
    assert not [r for r in caplog.records if "moe_router_bias_update_rate" in r.getMessage()]
    assert _moved_by_an_update("ernie45_vl", provider, chunk) == set(routers)
