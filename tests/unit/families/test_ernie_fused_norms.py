"""ERNIE-4.5-VL's fused norm + linear in every CPU build: the parameters a TE machine's model has.

Bridge's ERNIE decoder spec builds, without TE, a plain linear where TE fuses the norm into it ("No fused LN+Linear
without TE"): no ``linear_qkv.layer_norm_weight`` (the checkpoint's ``input_layernorm``) and no dense
``linear_fc1.layer_norm_weight`` (``post_attention_layernorm``). The HF-checkpoint path patched that, the plan's
full-size build did not: ``plan --hf-config`` on ERNIE-4.5-VL-28B-A3B was 74,240 parameters short (28 x 2,560 +
2,560). The family's any-size CPU patches now carry it, so tiny, full-size and checkpoint builds all have them.
"""

from __future__ import annotations

import re

import pytest


def _norm_layers(model) -> tuple[set[int], set[int]]:
    """Decoder layers with an attention input norm, and with a dense-MLP norm."""
    attention, dense = set(), set()
    for name, _ in model.named_parameters():
        found = re.match(r"language_model\.decoder\.layers\.(\d+)\.(self_attention\.linear_qkv|mlp\.linear_fc1)"
                         r"\.layer_norm_weight$", name)
        if found:
            (attention if found[2].startswith("self") else dense).add(int(found[1]))
    return attention, dense


@pytest.mark.parametrize("context", ["tiny", "full_size"])
def test_every_decoder_layer_has_its_input_norm_and_the_dense_layer_its_mlp_norm(cpu_bridge, context):
    from bridge_freeze_harness.tiny import build_tiny_model, make_provider
    from bridge_freeze_plugin.planning import build_meta_model

    provider = make_provider("ernie45_vl")
    if context == "tiny":
        model = build_tiny_model("ernie45_vl", provider=provider)
    else:  # the plan's context for a real config: the family's any-size CPU patches only
        model, _ = build_meta_model(provider, family_name="ernie45_vl")
    layers = set(range(provider.num_layers))
    dense = {i for i, moe in enumerate(provider.moe_layer_freq) if not moe}
    assert dense and dense != layers  # the tiny model has both kinds of layer
    assert _norm_layers(model) == (layers, dense)
