"""Full activation recompute runs on the CPU (the harness stubs megatron-core's CUDA RNG save / restore and
runs the backward, where the recompute happens, inside its forward patches), which makes Bridge's own
Qwen3-VL recompute defect measurable without a GPU.

Bridge 0.6.2's Qwen3-VL, built by Bridge alone (the plugin's provider wrapper bypassed), all parts training,
``recompute_granularity="full"`` / ``"uniform"`` / 1 layer vs no recompute, same weights, same batch, no
dropout: the loss is equal, but the vision tower's recompute drops the DeepStack features' autograd link, so
the 12 DeepStack merger tensors get NO gradient and the 27 other vision-encoder tensors (patch embedding,
position embedding, both layers; not the final merger) get a WRONG one. The language model's gradients are
right. Sets below are computed from names, independently of the plugin. Through the plugin's provider path
(which turns recompute off in the Qwen3-VL vision tower only) every gradient equals the reference.
"""

from __future__ import annotations

import pytest
import torch

from bridge_freeze_harness import train
from bridge_freeze_harness.tiny import build_context

RECOMPUTE = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
NO_DROPOUT = {"hidden_dropout": 0.0, "attention_dropout": 0.0}


def _bridge_only_build(**fields: object) -> tuple[torch.nn.Module, dict]:
    provider = train.make_provider("qwen3_vl", **NO_DROPOUT, **fields)
    provide = type(provider).provide
    provide = getattr(provide, "__bridge_freeze_wrapped__", provide)  # Bridge's own, if the plugin wrapped it
    torch.manual_seed(0)
    with build_context("qwen3_vl"):
        model = provide(provider, pre_process=True, post_process=True)
    model.train()
    return model, train.synthetic_batch("qwen3_vl", provider)


@pytest.fixture(scope="module")
def plain_and_recomputed(cpu_bridge):
    plain, batch = _bridge_only_build()
    recomputed, _ = _bridge_only_build(**RECOMPUTE)
    assert recomputed.vision_model.config.recompute_granularity == "full"  # the vision tower really recomputes
    for (name, a), (_, b) in zip(plain.named_parameters(), recomputed.named_parameters(), strict=True):
        assert torch.equal(a, b), f"{name}: the two builds must start from the same weights"
    losses = [train.forward_backward(model, batch, "qwen3_vl") for model in (plain, recomputed)]
    return plain, recomputed, losses


def test_full_recompute_runs_forward_and_backward_on_the_cpu_with_the_same_loss(plain_and_recomputed):
    _, _, (loss, recomputed_loss) = plain_and_recomputed
    assert torch.isfinite(loss)
    assert recomputed_loss.item() == loss.item()


def test_qwen3_vl_recompute_defect_is_measured_exactly(plain_and_recomputed):
    plain, recomputed, _ = plain_and_recomputed
    names = [n for n, _ in plain.named_parameters()]
    deepstack = {n for n in names if n.startswith("vision_model.decoder.deepstack_merger_list.")}
    encoder = {n for n in names if n.startswith("vision_model.") and not n.startswith("vision_model.merger.")}
    encoder -= deepstack
    assert (len(deepstack), len(encoder)) == (12, 27)

    reference = dict(plain.named_parameters())
    assert all(p.grad is not None for p in reference.values())
    no_grad = {n for n, p in recomputed.named_parameters() if p.grad is None}
    wrong = {
        n
        for n, p in recomputed.named_parameters()
        if p.grad is not None and not torch.allclose(p.grad, reference[n].grad, rtol=1e-4, atol=1e-6)
    }
    assert no_grad == deepstack
    assert wrong == encoder


def test_through_the_plugin_recompute_gives_the_reference_gradients(plain_and_recomputed):
    """The same measurement through the plugin's provider path (all three parts training): every gradient,
    vision side included, equals the no-recompute reference (the plugin's fix, measured on the CPU)."""
    from bridge_freeze_harness.tiny import build_tiny_model
    from bridge_freeze_plugin import FreezeSelection, make_freezable

    plain, _, (loss, _) = plain_and_recomputed
    provider = make_freezable(train.make_provider("qwen3_vl", **NO_DROPOUT, **RECOMPUTE), FreezeSelection())
    torch.manual_seed(0)
    model = build_tiny_model("qwen3_vl", provider)
    model.train()
    plugin_loss = train.forward_backward(model, train.synthetic_batch("qwen3_vl", provider), "qwen3_vl")
    assert plugin_loss.item() == loss.item()
    reference = dict(plain.named_parameters())
    differ = {
        n
        for n, p in model.named_parameters()
        if p.grad is None or not torch.allclose(p.grad, reference[n].grad, rtol=1e-4, atol=1e-6)
    }
    assert differ == set()
