"""Every family, every selection of its parts (8 for a vision-language model): the exact set of trainable names.

The expectation comes from the tests' own table (``_family_parts.py``: regular expressions written from
reading each Bridge model's module tree), never from the plugin's registry. Models are the real tiny Bridge
models where they build on the CPU, the structural stand-in otherwise (see README).
"""

from __future__ import annotations

import re

import pytest
from _family_parts import FROZEN_AS_BUILT, PARTS, part_of, parts_of, selections_of

from bridge_freeze_harness.tiny import TINY_FAMILIES, build_tiny_chunks, is_real, make_provider
from bridge_freeze_plugin import FreezeSelection, make_freezable

# Modules Bridge's own freeze() leaves to no flag: ours must put them in the vision encoder.
BRIDGE_FREEZE_GAPS = {
    "glm45v": ("visual.embeddings", "visual.post_conv_layernorm", "visual.downsample", "visual.post_layernorm"),
    "ernie45_vl": ("vision_tower.ln",),
}

def expected_trainable(family: str, names: set[str], selection: FreezeSelection) -> set[str]:
    frozen = {p.value for p in selection.frozen_parts()}
    never = FROZEN_AS_BUILT.get(family)
    return {n for n in names if part_of(family, n) not in frozen and not (never and re.match(never, n))}


def test_the_table_covers_every_tiny_family():
    assert set(PARTS) == set(TINY_FAMILIES)


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_every_selection_trains_exactly_what_was_asked(cpu_bridge, family):
    for selection in selections_of(family):
        provider = make_freezable(make_provider(family), selection)
        chunks = build_tiny_chunks(family, provider=provider)
        names = {n for c in chunks for n, _ in c.named_parameters()}
        got = {n for c in chunks for n, p in c.named_parameters() if p.requires_grad}
        want = expected_trainable(family, names, selection)
        assert got == want, (
            f"{family} {selection}: unexpectedly trainable {sorted(got - want)[:5]}, "
            f"unexpectedly frozen {sorted(want - got)[:5]}"
        )
        # Every part the family has is really present in the tiny model.
        assert {part_of(family, n) for n in names} >= set(parts_of(family))
        if "other" in PARTS[family]:
            assert "other" in {part_of(family, n) for n in names}, f"{family}: the tiny model has no `other` part"


@pytest.mark.parametrize("family", sorted(BRIDGE_FREEZE_GAPS))
def test_modules_bridge_leaves_unfrozen_are_frozen_with_the_vision_model(cpu_bridge, family):
    projection_only = FreezeSelection(freeze_language_model=True, freeze_vision_model=True)
    provider = make_freezable(make_provider(family), projection_only)
    chunks = build_tiny_chunks(family, provider=provider)
    params = {n: p for c in chunks for n, p in c.named_parameters()}
    for module in BRIDGE_FREEZE_GAPS[family]:
        under = [n for n in params if n.startswith(module + ".")]
        assert under, f"{family}: the tiny model has no {module} (the test would prove nothing)"
        assert not any(params[n].requires_grad for n in under), f"{family}: {module} still trains"

    # Negative control: Bridge's own provide() + freeze(), with all three flags, leaves them training.
    from bridge_freeze_harness.tiny import build_context
    from bridge_freeze_plugin import get_family

    bridge_cls = get_family(family).resolve_providers()[0]
    provider.freeze_vision_projection = True
    with build_context(family):
        bare = bridge_cls.provide.__bridge_freeze_wrapped__(provider, pre_process=True, post_process=True)
    still_training = {n for n, p in bare.named_parameters() if p.requires_grad}
    assert still_training == {n for n in still_training if n.startswith(BRIDGE_FREEZE_GAPS[family])}
    assert {n.rsplit(".", 1)[0] for n in still_training} and all(
        any(n.startswith(m + ".") for n in still_training) for m in BRIDGE_FREEZE_GAPS[family]
    )


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_family_builds_through_provide_and_provide_distributed_model(cpu_bridge, family):
    from bridge_freeze_harness.tiny import build_tiny_model, family_module

    model = build_tiny_model(family)
    chunks = build_tiny_chunks(family)
    assert len(chunks) == 1
    names = {n for n, _ in model.named_parameters()}
    assert names == {n for n, _ in chunks[0].named_parameters()}
    if is_real(family):
        assert type(model).__module__.startswith("megatron.bridge.models.")
    else:
        assert family_module(family).STAND_IN_REASON


def test_bridge_own_freeze_does_not_run_so_nemotron_prints_nothing(cpu_bridge, capfd):
    """Nemotron-VL's own freeze() prints one line per frozen parameter on every rank; ours replaces it."""
    provider = make_freezable(make_provider("nemotron_vl"), FreezeSelection(True, True, False))
    capfd.readouterr()
    (chunk,) = build_tiny_chunks("nemotron_vl", provider=provider)
    out, err = capfd.readouterr()
    assert "Freezing" not in out + err
    assert any(p.requires_grad for p in chunk.parameters())

    # Negative control: Bridge's own provide() (under the plugin's wrapper) does print.
    from megatron.bridge.models.nemotron_vl.nemotron_vl_provider import NemotronVLModelProvider

    from bridge_freeze_harness.tiny import build_context

    bridge_provide = NemotronVLModelProvider.provide.__bridge_freeze_wrapped__  # Bridge's, unwrapped
    with build_context("nemotron_vl"):
        bridge_provide(provider, pre_process=True, post_process=True)
    out, _ = capfd.readouterr()
    assert "Freezing language_model." in out


def _exaone_build(selection: FreezeSelection, **provider_fields) -> tuple[object, set[str]]:
    provider = make_freezable(make_provider("exaone45_vl", **provider_fields), selection)
    (chunk,) = build_tiny_chunks("exaone45_vl", provider=provider)
    return provider, {n for n, p in chunk.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("selection", [FreezeSelection(True, True, True), FreezeSelection(True, False, False)])
def test_exaone_mtp_follows_bridge_freeze_mtp_model_not_our_flags(cpu_bridge, selection):
    """Bridge trains EXAONE 4.5's MTP block unless freeze_mtp_model, even with the language model frozen."""
    provider, trainable = _exaone_build(selection)
    mtp = {n for n in trainable if n.startswith("language_model.mtp.")}
    assert mtp and not any(n.startswith("language_model.decoder.") for n in trainable)
    # freeze_mtp_model (Bridge's own flag, left on the provider) still freezes it.
    _, with_flag = _exaone_build(selection, freeze_mtp_model=True)
    assert not any(n.startswith("language_model.mtp.") for n in with_flag)

    # Parity: Bridge's own provide() + freeze() with the same flags leaves the same MTP parameters training.
    from bridge_freeze_harness.tiny import build_context
    from bridge_freeze_plugin import get_family

    bridge_cls = get_family("exaone45_vl").resolve_providers()[0]
    with build_context("exaone45_vl"):
        bare = bridge_cls.provide.__bridge_freeze_wrapped__(provider, pre_process=True, post_process=True)
    assert {n for n, p in bare.named_parameters() if p.requires_grad and n.startswith("language_model.mtp.")} == mtp
