"""The build-time guarantee judges what hooks took away, not only what they added (issue 22, item 2).

Bridge's PEFT hook freezes the WHOLE model before it adds its adapters. A second PEFT hook (or any later hook
that freezes) therefore silently freezes the first one's adapters. Adapters that trained after the hook that
added them and are frozen at the end are a violation, named, with the hook that froze them. The expected names
are computed from the model's names (``.adapter.`` segments of the first LoRA's targets), not by the plugin.
"""

from __future__ import annotations

import re

import pytest

import bridge_freeze_plugin as bfp
from bridge_freeze_harness.tiny import build_tiny_chunks, make_provider


def _lora(targets):
    from megatron.bridge.peft.lora import LoRA

    return LoRA(target_modules=list(targets), dim=4, alpha=8)


def _freeze_adapters(chunks):
    for chunk in chunks:
        for name, param in chunk.named_parameters():
            if ".adapter." in name:
                param.requires_grad_(False)
    return chunks


def _read_only(chunks):
    return chunks


def _build(selection, hooks):
    provider = bfp.make_freezable(make_provider("qwen3_vl"), selection)
    for hook in hooks:
        provider.register_pre_wrap_hook(hook)
    return build_tiny_chunks("qwen3_vl", provider=provider)


def _adapters_of(targets, selection):
    """The adapter parameter names one LoRA with ``targets`` adds (a build with that LoRA alone)."""
    chunks = _build(selection, [_lora(targets)])
    return {n for c in chunks for n, p in c.named_parameters() if ".adapter." in n and p.requires_grad}


FIRST = ["language_model.*linear_qkv"]
SELECTIONS = [bfp.FreezeSelection(True, True, True), bfp.FreezeSelection(True, True, False)]


@pytest.mark.parametrize("selection", SELECTIONS, ids=["adapters-only", "adapters+projection"])
@pytest.mark.parametrize("later", ["second-lora", "freeze-adapters-hook"])
def test_a_later_hook_that_freezes_earlier_adapters_is_a_violation(cpu_bridge, selection, later):
    first_adapters = _adapters_of(FIRST, selection)
    assert first_adapters
    second = _lora(["vision_model.*linear_proj"]) if later == "second-lora" else _freeze_adapters
    with pytest.raises(bfp.FreezeGuaranteeError) as err:
        _build(selection, [_lora(FIRST), second])
    lost = {v.name for v in err.value.violations if "later hook froze it" in v.why}
    assert lost == first_adapters
    name = "LoRA" if later == "second-lora" else "_freeze_adapters"
    assert re.search(rf"departed from the selection after pre-wrap hook \S*{name}", str(err.value))


@pytest.mark.parametrize("selection", SELECTIONS, ids=["adapters-only", "adapters+projection"])
def test_hooks_that_keep_the_adapters_pass(cpu_bridge, selection):
    chunks = _build(selection, [_lora(FIRST), _read_only])
    trained = {n for c in chunks for n, p in c.named_parameters() if p.requires_grad}
    assert _adapters_of(FIRST, selection) <= trained
