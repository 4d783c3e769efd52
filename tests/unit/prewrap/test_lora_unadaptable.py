"""A LoRA target that matches a module Bridge's LoRA cannot adapt is named (issue 46 item 16 and its build-time
sibling): Qwen2.5-VL's patch embedding is a ``Conv3d`` in a container module; Bridge's LoRA raised
``NotImplementedError: Layer type is unrecognized for LoRA`` or ``AttributeError: ... no attribute 'config'``,
naming neither the target nor the module. Real Bridge LoRA on the real tiny build; the
expected modules come from the model's own module types here."""

from __future__ import annotations

import pytest
import torch

import bridge_freeze_plugin as bfp
from bridge_freeze_harness.tiny import build_tiny_chunks, make_provider

FAMILY = "qwen25_vl"


def _lora(targets):
    from megatron.bridge.peft.lora import LoRA

    return LoRA(target_modules=list(targets), dim=4, alpha=8)


@pytest.mark.parametrize(("targets", "flags"), [
    (["visual.patch_embed.proj"], {}),  # plain LoRA: the plugin is not asked, Bridge's error still gets its name
    (["visual.patch_embed.proj"], {"freeze_language_model": True, "freeze_vision_model": True}),
    (["visual.patch_embed"], {"freeze_vision_projection": True}),  # the container module itself
])
def test_a_target_on_a_module_lora_cannot_adapt_is_named(cpu_bridge, targets, flags):
    provider = make_provider(FAMILY, **flags)
    provider.register_pre_wrap_hook(_lora(targets))
    with pytest.raises(bfp.UnadaptableLoraTargetError) as err:
        build_tiny_chunks(FAMILY, provider=provider)
    (chunk,) = build_tiny_chunks(FAMILY, provider=make_provider(FAMILY))  # the same model, no LoRA
    name = targets[0]
    module = dict(chunk.named_modules())[name]
    assert not isinstance(module, torch.nn.Linear)
    assert err.value.targets == (name,)
    assert err.value.modules == (f"{name} ({type(module).__name__})",)
    message = str(err.value)
    assert repr(name) in message and type(module).__name__ in message and "Bridge stopped with" in message
    assert isinstance(err.value.__cause__, (NotImplementedError, AttributeError))


def test_a_target_on_linear_layers_still_builds(cpu_bridge):
    """The diagnosis is only for Bridge's failure: a target on Megatron linears builds as before."""
    provider = make_provider(FAMILY, freeze_language_model=True, freeze_vision_model=True)
    provider.register_pre_wrap_hook(_lora(["language_model.*linear_qkv"]))
    (chunk,) = build_tiny_chunks(FAMILY, provider=provider)
    assert any("linear_qkv.adapter" in n for n, p in chunk.named_parameters() if p.requires_grad)
