"""Full activation recompute: which families get wrong gradients from it, and the plugin's fix, measured.

1. The verdict, per family that trains on the CPU (Bridge alone, the plugin's provide wrapper bypassed): every
   gradient under ``recompute_granularity="full"`` (uniform, 1 layer) is compared with the same model without
   recompute (same weights, same batch, no dropout). A family whose gradients differ must say so in its table
   (``FamilySpec.no_full_recompute``), and one whose gradients agree must not: the table is proven, both ways.
2. The fix, per affected family and per selection that trains an affected part: built through the plugin under
   full recompute, every trainable parameter's gradient equals the no-recompute one, none is missing, and every
   frozen parameter has none. Without the fix (1.) the same comparison fails.
"""

from __future__ import annotations

import pytest
import torch

from bridge_freeze_harness import train
from bridge_freeze_harness.tiny import build_context
from bridge_freeze_plugin import FreezeSelection, Part, get_family, make_freezable
from bridge_freeze_plugin.registry import REGISTRY

RECOMPUTE = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
NO_DROPOUT = {"hidden_dropout": 0.0, "attention_dropout": 0.0}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-6}


def _family(name: str):
    return REGISTRY.find(name) if name in REGISTRY else get_family(name.rsplit("_moe", 1)[0])


def _build(name: str, *, through_plugin: FreezeSelection | None = None, **fields):
    """A tiny model, seeded the same way every time; Bridge's own provide() unless a selection is given."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    provider = train.make_provider(name, **NO_DROPOUT, **fields)
    provider._pg_collection = ProcessGroupCollection.use_mpu_process_groups()
    provide = type(provider).provide
    if through_plugin is None:
        provide = getattr(provide, "__bridge_freeze_wrapped__", provide)
    else:
        make_freezable(provider, through_plugin)
    torch.manual_seed(0)
    with build_context(name):
        model = provide(provider, pre_process=True, post_process=True)
    model.train()
    return model, train.synthetic_batch(name, provider)


def _gradients(model, batch, name) -> dict[str, torch.Tensor | None]:
    train.forward_backward(model, batch, name)
    return {n: (None if p.grad is None else p.grad.detach().clone()) for n, p in model.named_parameters()}


def _disagreeing(grads: dict, reference: dict) -> set[str]:
    return {n for n, g in grads.items() if reference[n] is not None
            and (g is None or not torch.allclose(g, reference[n], **TOLERANCE))}


@pytest.fixture(scope="module")
def references(cpu_bridge):
    """name -> (gradients without recompute, all parts training); built once per family."""
    cache: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in cache:
            model, batch = _build(name)
            cache[name] = _gradients(model, batch, name)
        return cache[name]

    return get


@pytest.mark.parametrize("name", train.trainable_families())
def test_the_family_table_says_exactly_whether_full_recompute_breaks_its_gradients(references, name):
    model, batch = _build(name, **RECOMPUTE)
    wrong = _disagreeing(_gradients(model, batch, name), references(name))
    family = _family(name)
    if family.no_full_recompute:
        assert wrong, f"{name}: the table says full recompute breaks it, but every gradient agrees"
        broken_parts = {family.classify(n).value for n in wrong}
        assert broken_parts <= set(family.full_recompute_affects)
    else:
        assert not wrong, f"{name}: full recompute breaks {sorted(wrong)[:5]} but the family table does not say so"


AFFECTED = [n for n in train.trainable_families() if _family(n).no_full_recompute]


def _triggering_selections(name: str) -> list[FreezeSelection]:
    affects = {Part(p) for p in _family(name).full_recompute_affects}
    return [s for s in FreezeSelection.all_selections() if s.trained_parts() & affects]


@pytest.mark.parametrize(
    ("name", "selection"),
    [(n, s) for n in AFFECTED for s in _triggering_selections(n)],
    ids=lambda v: v if isinstance(v, str) else v.describe().replace(" ", "_"),
)
def test_with_the_fix_every_gradient_equals_the_one_without_recompute(references, name, selection):
    model, batch = _build(name, through_plugin=selection, **RECOMPUTE)
    family = _family(name)
    assert model.language_model.config.recompute_granularity == (
        None if "language_model" in family.no_full_recompute else "full")
    grads = _gradients(model, batch, name)
    reference = references(name)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(grads[n] is not None for n in trained)
    assert all(grads[n] is None for n in set(grads) - trained)
    assert not _disagreeing({n: grads[n] for n in trained}, reference)


def test_every_affected_family_is_measured():
    assert set(AFFECTED) >= {"qwen3_vl", "qwen3_vl_moe", "ernie45_vl"}


@pytest.mark.parametrize(("fields", "broken"), [
    ({"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 1}, True),
    ({"recompute_granularity": "selective"}, False),
], ids=["full-block", "selective"])
def test_other_recompute_settings_on_qwen3_vl(references, fields, broken):
    """Full recompute with the "block" method breaks the vision gradients like "uniform" (and is fixed the same
    way); selective recompute (inside attention only) gets every gradient right, so the plugin leaves it alone."""
    reference = references("qwen3_vl")
    model, batch = _build("qwen3_vl", **fields)
    assert bool(_disagreeing(_gradients(model, batch, "qwen3_vl"), reference)) is broken
    fixed, batch = _build("qwen3_vl", through_plugin=FreezeSelection(), **fields)
    assert fixed.vision_model.config.recompute_granularity == (None if broken else fields["recompute_granularity"])
    assert not _disagreeing(_gradients(fixed, batch, "qwen3_vl"), reference)


def test_an_affected_part_beyond_the_vision_three_counts_when_it_trains():
    """A family whose audio encoder full recompute gets wrong: the default selection trains it (no flag set), so
    it is affected; its flag set, it is not."""
    from bridge_freeze_plugin import FamilySpec
    from bridge_freeze_plugin.prewrap import affected_parts

    family = FamilySpec(name="toy_audio", providers=("toy.module:ToyProvider",), language_model=("lm",),
                        parts={"audio_model": ("audio",)}, no_full_recompute=("audio.config",),
                        full_recompute_affects=("audio_model",))
    assert affected_parts(family, FreezeSelection()) == ["audio_model"]
    assert affected_parts(family, FreezeSelection(freeze_audio_model=True)) == []
