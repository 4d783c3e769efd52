"""A family with a layout per provider class (issue 36): Nemotron Omni on Bridge main (0.7.0, NeMo-RL's pin).

On 0.7.0 ``NemotronOmniModelProvider.provide()`` builds ``NemotronOmniModel``, its five parts at the top level
(``language_model``, ``vision_model``, ``vision_projection``, ``sound_model``, ``sound_projection``), and the class
declares ``nemotron_omni_contract``; the legacy ``NemotronOmniLlavaModelProvider`` (its subclass) keeps the LLaVA
model (``llava_model.*``), as 0.6.2's ``NemotronOmniModelProvider`` builds it.

The 0.6.2 cases run the real tiny Bridge build. On 0.6.2 (CI) the 0.7.0 cases use a structural stand-in (0.7.0 is
not installable in CI): a subclass of the real 0.6.2 provider named as 0.7.0's class, declaring its field, whose
``provide()`` puts the real 0.6.2 modules at the top level as 0.7.0's model holds them. Where 0.7.0 is installed
(the compatibility lane, scripts/compat_lane.py) they run its two real classes, and the 0.6.2 case is skipped.
Expected sets come from the tests' own module table, never from the plugin's.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import pytest
import torch

import bridge_freeze_plugin as bfp
from bridge_freeze_harness.tiny import build_context, build_tiny_chunks, make_provider

OMNI = "nemotron_omni"
#: plugin flag -> the module (0.7.0's top-level name; under ``llava_model.`` on the LLaVA layout)
MODULES = {"freeze_language_model": "language_model", "freeze_vision_model": "vision_model",
           "freeze_vision_projection": "vision_projection", "freeze_audio_model": "sound_model",
           "freeze_audio_projection": "sound_projection"}


@pytest.fixture(scope="module")
def classes(cpu_bridge) -> dict[str, type]:
    """0.6.2's real provider, and stand-ins named as 0.7.0's two classes (0.7.0 is not installable in CI)."""
    from megatron.bridge.models.nemotron_omni import nemotron_omni_provider as module

    real = module.NemotronOmniModelProvider
    if hasattr(module, "NemotronOmniLlavaModelProvider"):  # Bridge 0.7.0 itself: its real classes
        return {"0.7.0": real, "0.7.0 legacy": module.NemotronOmniLlavaModelProvider}
    llava_provide = real.provide.__bridge_freeze_wrapped__  # 0.6.2's own build of the LLaVA model

    class NemotronOmniModel(torch.nn.Module):  # 0.7.0's model: the parts at the top level
        def __init__(self, llava: Any) -> None:
            super().__init__()
            self.config = llava.config  # a MegatronModule's, as 0.7.0's model is
            for name in MODULES.values():
                setattr(self, name, getattr(llava.llava_model, name))

    namespace = {"__module__": module.__name__, "__qualname__": "NemotronOmniModelProvider",
                 "__annotations__": {"nemotron_omni_contract": "str | None"}, "nemotron_omni_contract": "expanded",
                 "provide": lambda self, pre_process=None, post_process=None, vp_stage=None: NemotronOmniModel(
                     llava_provide(self, pre_process, post_process, vp_stage))}
    top_level = dataclasses.dataclass(type("NemotronOmniModelProvider", (real,), namespace))
    legacy = dataclasses.dataclass(type("NemotronOmniLlavaModelProvider", (top_level,), {
        "__module__": module.__name__, "__qualname__": "NemotronOmniLlavaModelProvider",
        "provide": lambda self, pre_process=None, post_process=None, vp_stage=None: llava_provide(
            self, pre_process, post_process, vp_stage)}))
    return {"0.6.2": real, "0.7.0": top_level, "0.7.0 legacy": legacy}


def provider_of(classes: dict[str, type], which: str, **flags: bool) -> Any:
    if which not in classes:
        pytest.skip(f"the installed Bridge has no {which} Nemotron Omni provider")
    provider = make_provider(OMNI, **flags)
    provider.__class__ = classes[which]
    llava_contract = getattr(sys.modules[classes[which].__module__], "NEMOTRON_OMNI_LLAVA_CONTRACT", None)
    if which == "0.7.0 legacy" and llava_contract is not None:  # 0.7.0's legacy class builds only for its contract
        provider.nemotron_omni_contract = llava_contract
    return provider


def expected_trainable(names: set[str], prefix: str, flags: dict[str, bool]) -> set[str]:
    frozen = tuple(f"{prefix}{MODULES[flag]}." for flag, on in flags.items() if on)
    return {n for n in names if not n.startswith(frozen)}


CASES = [{"freeze_language_model": True, "freeze_vision_model": True},
         {"freeze_audio_model": True, "freeze_vision_projection": True}]


@pytest.mark.parametrize("flags", CASES)
@pytest.mark.parametrize(("which", "prefix"), [("0.6.2", "llava_model."), ("0.7.0", ""),
                                                ("0.7.0 legacy", "llava_model.")])
def test_each_provider_class_is_classified_by_its_own_layout(classes, which, prefix, flags):
    provider = provider_of(classes, which, **flags)
    (chunk,) = build_tiny_chunks(OMNI, provider=provider)
    names = {n for n, _ in chunk.named_parameters()}
    assert all(n.startswith(tuple(f"{prefix}{m}." for m in MODULES.values())) for n in names)
    assert {n for n, p in chunk.named_parameters() if p.requires_grad} == expected_trainable(names, prefix, flags)


def test_the_070_layout_on_a_plain_provide_and_its_report(classes):
    flags = {"freeze_language_model": True}
    provider = provider_of(classes, "0.7.0", **flags)
    with build_context(OMNI):
        model = provider.provide()
    names = {n for n, _ in model.named_parameters()}
    assert {n for n, p in model.named_parameters() if p.requires_grad} == expected_trainable(names, "", flags)
    spec = bfp.family_for_provider(provider)
    by_part = {part: {n for n in names if spec.classify(n) is part} for part in spec.part_names()}
    assert {p.value: {n.split(".")[0] for n in found} for p, found in by_part.items()} == {
        "language_model": {"language_model"}, "vision_model": {"vision_model"},
        "vision_projection": {"vision_projection"}, "audio_model": {"sound_model"},
        "audio_projection": {"sound_projection"}}
    report = bfp.last_report(provider)  # the report counts each part of the top-level tree, nothing under other
    params = dict(model.named_parameters())
    for flag, module in MODULES.items():
        count = next(c for c in report.parts if c.part is not None and c.part.value == flag.removeprefix("freeze_"))
        inside = [p for n, p in params.items() if n.startswith(module + ".")]
        assert (count.total, count.trainable) == (sum(p.numel() for p in inside),
                                                  sum(p.numel() for p in inside if p.requires_grad)), module
    assert report.total == sum(p.numel() for p in params.values())
    assert report.trainable == sum(p.numel() for p in params.values() if p.requires_grad)


def test_the_new_hf_model_type_is_nemotron_omni():
    assert bfp.get_family(OMNI) is bfp.REGISTRY.for_hf_model_type("NemotronH_Super_Omni_Reasoning_V3")


@pytest.mark.parametrize("flags", CASES)
@pytest.mark.parametrize(("which", "prefix"), [("0.6.2", "llava_model."), ("0.7.0", "")])
def test_apply_selection_reads_a_model_by_the_layout_its_names_fit(classes, which, prefix, flags):
    """Issue 49: the public ``apply_selection(model, get_family("nemotron_omni"), ...)`` used the family's own
    (LLaVA) table on 0.7.0's top-level model and raised UnclassifiedParameterError for every parameter; with no
    provider to ask, the table is the one the model's names fit."""
    provider = provider_of(classes, which)
    with build_context(OMNI):
        model = provider.provide()
    names = {n for n, _ in model.named_parameters()}
    assert all(n.startswith(tuple(f"{prefix}{m}." for m in MODULES.values())) for n in names)
    report = bfp.apply_selection(model, bfp.get_family(OMNI), bfp.FreezeSelection(**flags))
    expected = expected_trainable(names, prefix, flags)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == expected
    assert report.trainable == sum(p.numel() for n, p in model.named_parameters() if n in expected)
