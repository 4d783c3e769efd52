"""Each family's ``linear_leaves`` (what check-config matches a leaf-name LoRA target against, SkyRL's all-linear
list among them) is what the built model has: every tiny family is built through its real provider, and the leaf
names of its linear modules are sorted into parts by the tests' own table (``tests/unit/_family_parts.py``), never
by the registry."""

from __future__ import annotations

import pytest
import torch
from _family_parts import part_of

from bridge_freeze_plugin.errors import FamilyRegistrationError
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.registry import get_family

#: tiny configuration -> registry family, where the names differ
_FAMILY = {"qwen35_vl_moe": "qwen35_vl"}
#: Linear modules by class name: torch.nn.Linear, Megatron's and TE's parallel linears (EXAONE's
#: RowParallelLinearLayerNorm too), the grouped experts' stand-in.
_LINEAR = "Linear"


def _tiny() -> list[str]:
    from bridge_freeze_harness.tiny import TINY_FAMILIES

    return sorted(TINY_FAMILIES)


def _leaves(model: torch.nn.Module, family: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if _LINEAR not in type(module).__name__ or not isinstance(weight, torch.nn.Parameter):
            continue
        found.setdefault(part_of(family, f"{name}.weight"), set()).add(name.rpartition(".")[2])
    return found


@pytest.mark.slow
@pytest.mark.parametrize("tiny", _tiny())
def test_the_leaf_table_is_what_the_built_model_has(tiny, cpu_bridge):
    from bridge_freeze_harness.tiny import build_tiny_model

    model = build_tiny_model(tiny)
    name = _FAMILY.get(tiny, tiny)
    spec = get_family(name).for_class(type(model))
    table = {part: set(leaves) for part, leaves in spec.linear_leaves}
    built = _leaves(model, tiny)
    # the output layer is listed for every language model: absent where the tiny config ties the embeddings
    assert {p: v - {"output_layer"} for p, v in built.items()} == {
        p: v - {"output_layer"} for p, v in table.items()}


def test_a_leaf_table_names_parts_and_module_name_segments():
    base = {"name": "fam", "providers": ("pkg.mod:Cls",), "language_model": ("lm",), "vision_model": ("vis",)}
    spec = FamilySpec(**base, linear_leaves={"vision_model": ("qkv", "proj"), "language_model": ("linear_qkv",)})
    assert spec.linear_leaves == (("language_model", ("linear_qkv",)), ("vision_model", ("proj", "qkv")))
    assert spec.linear_leaves_of(get_part("audio_model")) == ()
    assert FamilySpec(**base).linear_leaves_of(get_part("vision_model")) is None  # no table: the build tells
    with pytest.raises(FamilyRegistrationError, match="its keys are the family's parts"):
        FamilySpec(**base, linear_leaves={"audio_model": ("fc1",)})
    with pytest.raises(FamilyRegistrationError, match="no module-name segment"):
        FamilySpec(**base, linear_leaves={"vision_model": ("blocks.0.qkv",)})
    with pytest.raises(FamilyRegistrationError, match="not the string 'qkv'"):
        FamilySpec(**base, linear_leaves={"vision_model": "qkv"})


def get_part(name: str):
    from bridge_freeze_plugin.request import Part

    return Part(name)
