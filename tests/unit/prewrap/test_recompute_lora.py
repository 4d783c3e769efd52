"""Full recompute is fixed for what actually trains, and never rewrites the provider (issue 22, items 1 and 16).

Item 1: with all three flags set and LoRA on Bridge's default targets, nothing trains at full rank, but LoRA
puts adapters into Qwen3-VL's vision layers and DeepStack mergers; under ``recompute_granularity="full"`` those
adapters got no gradient or a wrong one, because the fix was decided from the flags before any PEFT hook ran.
Now it is decided again from what trains at the end of the hooks. Expected gradients: the same build
without recompute (same seed, same weights, same adapters), computed by running it, not by the plugin.

Item 16: the fix gives the affected modules private copies of their configs; the provider (which Bridge
writes to ``run_config.yaml`` and reads on resume) keeps the recompute settings the user gave it.
"""

from __future__ import annotations

import pytest
import torch

import bridge_freeze_plugin as bfp
from bridge_freeze_harness import train
from bridge_freeze_harness.tiny import build_tiny_chunks

RECOMPUTE = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
NO_DROPOUT = {"hidden_dropout": 0.0, "attention_dropout": 0.0}
DEFAULT_TARGETS = ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]


def _build(name, selection, peft_targets, **fields):
    from megatron.bridge.peft.lora import LoRA

    provider = bfp.make_freezable(train.make_provider(name, **NO_DROPOUT, **fields), selection)
    if peft_targets:
        provider.register_pre_wrap_hook(LoRA(target_modules=list(peft_targets), dim=4, alpha=8))
    torch.manual_seed(0)
    (chunk,) = build_tiny_chunks(name, provider=provider)
    chunk.train()
    return provider, chunk


def _gradients(name, chunk, provider):
    train.forward_backward(chunk, train.synthetic_batch(name, provider), name)
    return {n: p.grad for n, p in chunk.named_parameters() if p.requires_grad}


# (selection, LoRA targets): what trains on the vision side is adapters (and, in the second case, the
# full-rank projection); only the first and third are invisible to a decision made from the flags.
CASES = {
    "adapters-only-default-targets": (bfp.FreezeSelection(True, True, True), DEFAULT_TARGETS),
    "adapters+full-rank-projection": (bfp.FreezeSelection(True, True, False), ["linear_qkv", "linear_proj"]),
    "adapters-only-vision-attention": (bfp.FreezeSelection(True, True, True), ["vision_model.*linear_qkv"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_lora_adapters_under_full_recompute_get_the_reference_gradients(cpu_bridge, case):
    selection, targets = CASES[case]
    ref_provider, reference = _build("qwen3_vl", selection, targets)
    provider, recomputed = _build("qwen3_vl", selection, targets, **RECOMPUTE)
    expected = _gradients("qwen3_vl", reference, ref_provider)
    got = _gradients("qwen3_vl", recomputed, provider)
    assert got.keys() == expected.keys()
    vision_adapters = {n for n in got if n.startswith("vision_model.") and ".adapter." in n}
    assert vision_adapters  # LoRA did reach the vision side: the case the fix must see
    missing = {n for n, g in got.items() if g is None}
    wrong = {n for n, g in got.items() if g is not None and not torch.allclose(g, expected[n], rtol=1e-4, atol=1e-6)}
    assert (missing, wrong) == (set(), set())
    assert any("recompute turned off" in note for note in bfp.last_report(provider).notes)


def test_language_model_only_lora_under_full_recompute_keeps_recompute_everywhere(cpu_bridge):
    """Nothing on the vision side trains: no fix is needed, none is applied (no note, the tower recomputes)."""
    provider, chunk = _build("qwen3_vl", bfp.FreezeSelection(True, True, True), ["language_model.*linear_qkv"],
                             **RECOMPUTE)
    assert chunk.vision_model.decoder.config.recompute_granularity == "full"
    assert not bfp.last_report(provider).notes


@pytest.mark.parametrize(("name", "where"), [("qwen3_vl", "vision_model"), ("ernie45_vl", "language_model")])
def test_the_fix_never_rewrites_the_providers_settings(cpu_bridge, name, where):
    provider, chunk = _build(name, bfp.FreezeSelection(), None, **RECOMPUTE)
    before = {k: getattr(provider, k) for k in RECOMPUTE}
    assert before == RECOMPUTE
    vision_config = getattr(provider, "vision_config", None)
    vision_before = getattr(vision_config, "recompute_granularity", None)
    fixed = getattr(chunk, where)
    assert fixed.config.recompute_granularity is None  # the fix did apply
    assert fixed.config is not provider
    assert {k: getattr(provider, k) for k in RECOMPUTE} == RECOMPUTE  # the provider is as the user wrote it
    assert getattr(vision_config, "recompute_granularity", None) == vision_before
    untouched = [m for n, m in chunk.named_modules() if not (n == where or n.startswith(where + "."))
                 and getattr(m, "config", None) is provider]
    assert all(m.config.recompute_granularity == "full" for m in untouched)
