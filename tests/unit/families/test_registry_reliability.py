"""Issue 22, class 18: a family registration that would silently mean something else is refused.

- a string (or bytes) where a list is expected was split into single letters (``language_model="language_model"``
  registered the prefixes 'l', 'a', 'n', ...): refused in every sequence field, through ``register_family`` and
  ``FamilySpec`` alike, and so are a mapping and the wrong type for the scalar fields;
- a second family could claim an HF model type another family holds (``qwen3_vl``), and which one a checkpoint
  resolved to depended on the sort order of names: refused, naming the owner, as a second claim on a provider class
  already was (by path or by class object).
"""

from __future__ import annotations

import re

import pytest

from bridge_freeze_plugin import FamilySpec, register_family
from bridge_freeze_plugin.errors import FamilyRegistrationError
from bridge_freeze_plugin.registry import REGISTRY, FamilyRegistry, get_family

#: Every field of a family that holds a sequence of strings, written out here (not read from the plugin).
SEQUENCES = ("providers", "language_model", "vision_model", "vision_projection", "other", "hf_model_types",
             "no_full_recompute", "full_recompute_affects")


def fields(**changes):
    base = {
        "providers": ["my_pkg.provider:MyVLMProvider"],
        "language_model": ["language_model"],
        "vision_model": ["vision_tower"],
        "vision_projection": ["projector"],
        "hf_model_types": ["my_vlm"],
    }
    base.update(changes)
    return base


class Provider:  # a provider class given as a class object (its import path is what gets registered)
    pass


def test_lists_are_registered_as_written():
    registry = FamilyRegistry()
    spec = register_family("my_vlm", registry=registry, **fields(
        providers=[Provider], language_model=("language_model", "lm_head"), vision_model=iter(["vision_tower"]),
        other={"audio_tower"}))
    assert spec.providers == (f"{__name__}:Provider",)
    assert spec.language_model == ("language_model", "lm_head")
    assert spec.vision_model == ("vision_tower",)
    assert spec.other == ("audio_tower",)
    assert registry.names() == ["my_vlm"]


@pytest.mark.parametrize("attr", SEQUENCES)
@pytest.mark.parametrize("value", ["language_model", b"language_model", bytearray(b"vision"), "x"])
def test_a_string_where_a_list_belongs_is_refused_in_every_field(attr, value):
    registry = FamilyRegistry()
    changes = {attr: value}
    if attr in ("no_full_recompute", "full_recompute_affects"):  # these two go together
        changes = {"no_full_recompute": ["vision_tower"], "full_recompute_affects": ["vision_model"], attr: value}
    with pytest.raises(FamilyRegistrationError, match=rf"family 'my_vlm': {attr} must be a list of strings") as info:
        register_family("my_vlm", registry=registry, **fields(**changes))
    assert "one letter at a time" in str(info.value) and f"{attr}=[{value!r}]" in str(info.value)
    assert registry.names() == []  # nothing half-registered
    with pytest.raises(FamilyRegistrationError, match=rf"{attr} must be a list of strings"):
        FamilySpec(name="my_vlm", **fields(**changes))


@pytest.mark.parametrize("value", [{"language_model": 1}, 5, None, ["language_model", ""], ["language_model", 3]])
def test_a_mapping_a_scalar_or_a_bad_item_is_refused(value):
    with pytest.raises(FamilyRegistrationError, match=r"family 'my_vlm': language_model must"):
        register_family("my_vlm", registry=FamilyRegistry(), **fields(language_model=value))


@pytest.mark.parametrize(("attr", "value"), [("description", ["a VLM"]), ("recompute_note", 3), ("source", None)])
def test_scalar_fields_of_the_wrong_type_are_refused(attr, value):
    with pytest.raises(FamilyRegistrationError, match=rf"family 'my_vlm': {attr} must be"):
        register_family("my_vlm", registry=FamilyRegistry(), **fields(**{attr: value}))


def test_the_issue_case_single_letters_never_reach_the_registry():
    registry = FamilyRegistry()
    with pytest.raises(FamilyRegistrationError):
        register_family("my_vlm", registry=registry, **fields(language_model="language_model"))
    assert registry.get_or_none("my_vlm") is None


# ---------------------------------------------------------------------------------------- second claims


def test_a_second_family_cannot_claim_a_builtin_hf_model_type():
    owner = get_family("qwen3_vl")
    assert "qwen3_vl" in owner.hf_model_types
    before = REGISTRY.names()
    with pytest.raises(FamilyRegistrationError, match=re.escape(
            "family 'my_qwen': HF model type 'qwen3_vl' is already claimed by family 'qwen3_vl' (registered by "
            "builtin)")):
        register_family("my_qwen", **fields(providers=["my_pkg.qwen:MyQwen"], hf_model_types=["my_qwen", "qwen3_vl"]))
    assert REGISTRY.names() == before
    assert REGISTRY.for_hf_model_type("qwen3_vl") is owner
    assert REGISTRY.for_hf_model_type("my_qwen") is None  # nothing of the refused family stays behind


@pytest.mark.parametrize("claimed", [["my_vlm"], ["other_type", "my_vlm"], ("my_vlm",)])
def test_a_claimed_hf_model_type_is_refused_in_any_position_and_freed_by_unregister(claimed):
    registry = FamilyRegistry()
    first = register_family("first", registry=registry, **fields())
    second = fields(providers=["other_pkg.p:Other"], hf_model_types=claimed)
    with pytest.raises(FamilyRegistrationError, match="HF model type 'my_vlm' is already claimed by family 'first'"):
        register_family("second", registry=registry, **second)
    assert registry.names() == ["first"] and registry.for_hf_model_type("my_vlm") is first
    registry.unregister("first")
    assert registry.for_hf_model_type("my_vlm") is None
    spec = register_family("second", registry=registry, **second)
    assert registry.for_hf_model_type("my_vlm") is spec


@pytest.mark.parametrize("provider", [f"{__name__}:Provider", Provider])
def test_a_second_family_cannot_claim_a_provider_class_by_path_or_by_class(provider):
    registry = FamilyRegistry()
    register_family("first", registry=registry, **fields(providers=[Provider]))
    with pytest.raises(FamilyRegistrationError, match=re.escape(
            f"family 'second': provider {__name__}:Provider is already covered by family 'first'")):
        register_family("second", registry=registry, **fields(providers=[provider], hf_model_types=["second"]))
    assert registry.names() == ["first"]
    assert registry.for_provider_class(Provider).name == "first"


def test_a_second_family_cannot_claim_a_builtin_provider():
    path = get_family("qwen3_vl").providers[0]
    with pytest.raises(FamilyRegistrationError, match=re.escape(f"provider {path} is already covered by family "
                                                                "'qwen3_vl'")):
        register_family("my_qwen", **fields(providers=[path], hf_model_types=["my_qwen"]))
    assert "my_qwen" not in REGISTRY


def test_builtin_families_claim_distinct_hf_model_types():
    seen: dict[str, str] = {}
    for spec in REGISTRY:
        for model_type in spec.hf_model_types:
            assert model_type not in seen, (model_type, seen.get(model_type), spec.name)
            seen[model_type] = spec.name
    assert {t: REGISTRY.for_hf_model_type(t).name for t in seen} == seen
