"""Real training steps on the CPU: the tiny Bridge Qwen3-VL and Qwen2.5-VL train (finite loss, a
gradient on every trainable parameter), and after a projection-only freeze a few AdamW steps (with
weight decay) change exactly the projection tensors and no other."""

from __future__ import annotations

import math
import re

import pytest
import torch
from _shared import QWEN3_PROJECTION

from bridge_freeze_harness import train
from bridge_freeze_harness.tiny import build_tiny_chunks, build_tiny_model
from bridge_freeze_plugin import FreezeSelection, make_freezable

# Independent of the registry: the projection of each family, as read off Bridge's model code.
PROJECTION = {
    "qwen3_vl": QWEN3_PROJECTION,
    "qwen25_vl": re.compile(r"^visual\.merger\."),
}


@pytest.mark.parametrize("family", sorted(PROJECTION))
def test_full_model_trains_one_step(cpu_bridge, family):
    provider = train.make_provider(family)
    model = build_tiny_model(family, provider=provider)
    batch = train.synthetic_batch(family, provider)
    loss = train.loss_fn(model, batch, family)
    assert math.isfinite(loss.item())
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.any(p.grad != 0)]
    assert missing == []
    losses = train.train_steps(model, family, provider, steps=1)
    assert all(math.isfinite(x) for x in losses)


@pytest.mark.parametrize("family", sorted(PROJECTION))
def test_projection_only_steps_change_exactly_the_projection(cpu_bridge, family):
    provider = make_freezable(
        train.make_provider(family), FreezeSelection(freeze_language_model=True, freeze_vision_model=True)
    )
    (model,) = build_tiny_chunks(family, provider=provider)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses = train.train_steps(model, family, provider, steps=3)
    assert all(math.isfinite(x) for x in losses)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    expected = {n for n in before if PROJECTION[family].match(n)}
    assert expected, "the tiny model has no projection: the test would prove nothing"
    assert changed == expected
