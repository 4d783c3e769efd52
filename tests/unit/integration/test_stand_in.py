"""The seed's Qwen3-VL case on a Qwen3VLModel-shaped stand-in (no Megatron needed, milliseconds):
projection-only leaves exactly the merger and the DeepStack mergers trainable, and AdamW steps change
exactly those tensors. A second test proves the stand-in's names are the real tiny Bridge model's."""

from __future__ import annotations

import pytest
import torch
from _shared import QWEN3_PROJECTION as PROJECTION

from bridge_freeze_harness.stand_ins import Qwen3VLModelShaped
from bridge_freeze_plugin import FreezeSelection, apply_selection, get_family


@pytest.mark.slow  # builds and trains a model (seconds): the full suite runs it
def test_projection_only_on_the_stand_in_trains_and_changes_exactly_the_mergers():
    torch.manual_seed(0)
    model = Qwen3VLModelShaped()
    selection = FreezeSelection(freeze_language_model=True, freeze_vision_model=True)
    report = apply_selection(model, get_family("qwen3_vl"), selection)
    names = [n for n, _ in model.named_parameters()]
    expected = {n for n in names if PROJECTION.match(n)}
    assert {n for n, p in model.named_parameters() if p.requires_grad} == expected
    assert report.trainable == sum(p.numel() for n, p in model.named_parameters() if n in expected)

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        model.toy_loss().backward()
        optimizer.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert changed == expected


def test_the_stand_in_has_the_real_tiny_models_names_and_shapes(cpu_bridge):
    from bridge_freeze_harness.tiny import build_tiny_model

    real = {n: tuple(p.shape) for n, p in build_tiny_model("qwen3_vl").named_parameters()}
    shaped = {n: tuple(p.shape) for n, p in Qwen3VLModelShaped().named_parameters()}
    assert shaped == real
