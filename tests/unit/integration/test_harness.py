"""The CPU harness as a product part: an index derived from the family modules, and build contexts that
apply exactly the patches asked for (a full-size build gets no tiny-configuration patch)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from _family_parts import TINY_CONFIGS as EXPECTED_CONFIGS

from bridge_freeze_harness.tiny import _index


def test_the_index_lists_every_configuration_and_maps_the_moe_variant_to_its_family_module():
    from bridge_freeze_harness.tiny import TINY_FAMILIES

    assert set(TINY_FAMILIES) == EXPECTED_CONFIGS
    assert TINY_FAMILIES["qwen35_vl_moe"] == "qwen35_vl"
    assert _index.entry("qwen35_vl_moe").factory == "make_moe_provider"
    assert "no_such_family" not in TINY_FAMILIES
    with pytest.raises(KeyError, match="no_such_family"):
        _index.entry("no_such_family")


def test_a_new_module_is_indexed_without_editing_any_list(tmp_path):
    (tmp_path / "alpha_vl.py").write_text("REAL = True\n")
    (tmp_path / "beta_vl.py").write_text(
        textwrap.dedent(
            """
            CONFIGS = {"beta_vl": "make_provider", "beta_vl_moe": "make_moe"}
            FAMILY = "beta"
            """
        )
    )
    (tmp_path / "_helper.py").write_text("CONFIGS = {'not_a_family': 'x'}\n")
    assert _index.scan(tmp_path) == {
        "alpha_vl": _index.Entry("alpha_vl", "make_provider", "alpha_vl"),
        "beta_vl": _index.Entry("beta_vl", "make_provider", "beta"),
        "beta_vl_moe": _index.Entry("beta_vl", "make_moe", "beta"),
    }
    (tmp_path / "gamma.py").write_text("CONFIGS = {'beta_vl': 'make_provider'}\n")
    with pytest.raises(ValueError, match="beta_vl"):
        _index.scan(tmp_path)


def test_listing_names_imports_no_model_code():
    code = (
        "import sys; from bridge_freeze_harness.tiny import TINY_FAMILIES; names = sorted(TINY_FAMILIES); "
        "print(len(names), sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron', 'transformers')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(len(EXPECTED_CONFIGS)), "[]"]


def test_every_configuration_either_trains_or_says_why_not():
    from bridge_freeze_harness import train
    from bridge_freeze_harness.tiny import family_module

    for name in EXPECTED_CONFIGS:
        module = family_module(name)
        reason = getattr(module, "CANNOT_TRAIN", None)
        has_spec = name in getattr(module, "TRAIN_SPECS", {})
        assert has_spec != bool(reason), f"{name}: needs exactly one of TRAIN_SPECS[{name!r}] and CANNOT_TRAIN"
        assert (name in train.trainable_families()) == has_spec
        assert (name in train.TRAIN_SPECS) == has_spec


def test_a_needed_feature_is_found_by_what_exists(tmp_path, monkeypatch):
    (tmp_path / "needs_probe.py").write_text(
        textwrap.dedent(
            """
            import dataclasses

            OPTIONAL = None  # an optional import that failed

            @dataclasses.dataclass
            class Provider:
                plain: int = 0
                listed: list = dataclasses.field(default_factory=list)
                nothing: object = None
            """
        )
    )
    (tmp_path / "needs_broken.py").write_text("import no_such_dependency_of_a_present_module\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    present = _index.present
    assert present("needs_probe") and present("needs_probe:Provider")
    assert present("needs_probe:Provider.plain") and present("needs_probe:Provider.listed")
    assert present("needs_probe:Provider.nothing")  # a field is there whatever its default
    assert not present("needs_probe:Provider.absent") and not present("needs_probe:OPTIONAL")
    assert not present("needs_probe:Absent.attr") and not present("needs_probe_absent:X")
    assert not present("needs_probe.sub:X") and not present("no_such_package.module")
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_of_a_present_module"):
        present("needs_broken:X")  # a present module that fails to import is a bug to see, not an absent feature


def test_bridge_lacks_names_the_first_need_with_no_option_present(monkeypatch, cpu_bridge):
    from bridge_freeze_harness import tiny

    table = {"qwen25_vl": {"json:dumps": "found", "json:absent_a | os:absent_b": "the reason", "json:absent_c": "no"}}
    monkeypatch.setattr(_index, "declared", lambda attr: table if attr == "BRIDGE_NEEDS" else {})
    reason = "the installed Bridge cannot build qwen25_vl: no json:absent_a or os:absent_b (the reason)"
    assert tiny.bridge_lacks("qwen25_vl") == reason and tiny.bridge_lacks("qwen3_vl") is None
    with pytest.raises(tiny.BridgeLacks, match="absent_a or os:absent_b"):
        tiny.make_provider("qwen25_vl")
    table["qwen25_vl"] = {"json:absent_a | json:dumps": "one option is enough"}
    assert tiny.bridge_lacks("qwen25_vl") is None


def test_the_pinned_bridge_has_everything_the_family_modules_declare_they_need(cpu_bridge):
    declared = _index.declared("BRIDGE_NEEDS")
    assert {"exaone45_vl", "gemma4_vl", "minimax_m3_vl", "qwen2_audio"} <= set(declared)  # read from the sources
    assert {name: _index.bridge_lacks(name) for name in EXPECTED_CONFIGS} == dict.fromkeys(EXPECTED_CONFIGS)


def _nemotron_names() -> tuple[object, object]:
    from megatron.bridge.models.nemotron_vl import nemotron_vl_provider

    return nemotron_vl_provider.hybrid_stack_spec, nemotron_vl_provider.LLaVAModel


def test_cpu_build_context_applies_the_familys_any_size_patches_and_no_tiny_patch(cpu_bridge):
    from megatron.core.models.multimodal.llava_model import LLaVAModel

    from bridge_freeze_harness import cpu_build_context
    from bridge_freeze_harness.tiny import build_context

    spec_before, llava_before = _nemotron_names()
    assert llava_before is LLaVAModel
    with cpu_build_context("nemotron_vl"):
        spec, llava = _nemotron_names()
        assert spec is not spec_before  # any-size: the local hybrid spec
        assert llava is LLaVAModel  # tiny-only: the size-shrinking stand-in is NOT applied
    with cpu_build_context(None):
        assert _nemotron_names() == (spec_before, llava_before)
    with build_context("nemotron_vl"):
        spec, llava = _nemotron_names()
        assert spec is not spec_before and llava is not LLaVAModel
    assert _nemotron_names() == (spec_before, llava_before)


def test_cpu_build_context_resolves_a_registry_family_to_its_module(cpu_bridge):
    from megatron.core.ssm.gated_delta_net import common as gdn_common

    from bridge_freeze_harness import cpu_build_context

    assert gdn_common.HAVE_FLA is False
    for name in ("qwen35_vl", "qwen35_vl_moe"):
        with cpu_build_context(name):
            assert gdn_common.HAVE_FLA is True
    with cpu_build_context("a_family_the_harness_does_not_know"):
        assert gdn_common.HAVE_FLA is False
    assert gdn_common.HAVE_FLA is False


def test_kimi_offline_stand_ins_apply_at_any_size_and_are_undone(cpu_bridge):
    """Kimi K2.5 loads its vision classes from the hub's remote code, which no offline build can fetch: the stand-ins
    are part of the any-size CPU patches (a full-size ``plan`` needs them too) and are undone on exit."""
    from megatron.bridge.models.kimi_vl import modeling_kimi_k25_vl

    from bridge_freeze_harness import cpu_build_context
    from bridge_freeze_harness.tiny import build_context

    original = modeling_kimi_k25_vl.get_class_from_dynamic_module
    with cpu_build_context("kimi_k25_vl"):
        assert modeling_kimi_k25_vl.get_class_from_dynamic_module is not original
    assert modeling_kimi_k25_vl.get_class_from_dynamic_module is original
    with build_context("kimi_k25_vl"):
        assert modeling_kimi_k25_vl.get_class_from_dynamic_module is not original
    assert modeling_kimi_k25_vl.get_class_from_dynamic_module is original


def _default_layer_spec(provider: object) -> object:
    import dataclasses

    spec_field = {f.name: f for f in dataclasses.fields(provider)}["transformer_layer_spec"]
    return spec_field.default if spec_field.default is not dataclasses.MISSING else spec_field.default_factory()


@pytest.mark.parametrize(
    ("family", "te_named"),
    [
        ("gemma3_vl", "language_model.decoder.layers.0.self_attention.linear_qkv.layer_norm_weight"),
        ("gemma4_vl", "language_model.decoder.layers.0.self_attention.linear_proj.post_layernorm.weight"),
    ],
)
def test_bridges_own_te_layer_spec_builds_under_the_any_size_cpu_patches(cpu_bridge, family, te_named):
    """What a full-size ``plan --hf-config`` build gets: the provider's default (TE-only) spec, on the meta device."""
    import torch
    from megatron.core.process_groups_config import ProcessGroupCollection

    from bridge_freeze_harness import cpu_build_context
    from bridge_freeze_harness.tiny import make_provider

    provider = make_provider(family)
    provider.transformer_layer_spec = _default_layer_spec(provider)  # what AutoBridge leaves there
    provider._pg_collection = ProcessGroupCollection.use_mpu_process_groups()
    with cpu_build_context(family), torch.device("meta"):
        model = provider.provide(pre_process=True, post_process=True)
    names = {n for n, _ in model.named_parameters()}
    assert te_named in names  # TransformerEngine's parameter names, on local layers


@pytest.mark.parametrize(("sq", "skv", "window"), [(6, 6, (2, 0)), (4, 7, (1, 1)), (5, 5, 3)])
def test_cpu_sliding_window_mask_masks_exactly_the_keys_outside_the_window(sq, skv, window):
    from bridge_freeze_harness.forward import _sliding_window_causal_mask

    left, right = (window, 0) if isinstance(window, int) else window
    # Queries are aligned to the last keys: query i sits at key position i + skv - sq.
    expected = torch.tensor(
        [[not (i + skv - sq - left <= j <= i + skv - sq + right) for j in range(skv)] for i in range(sq)]
    )
    assert torch.equal(_sliding_window_causal_mask(sq, skv, window), expected)


def test_an_additive_attention_bias_becomes_a_mask_only_when_it_is_one():
    from bridge_freeze_harness.forward import _bias_as_mask

    blocked = torch.finfo(torch.float32).min
    bias = torch.tensor([[0.0, blocked], [0.0, 0.0]])
    assert torch.equal(_bias_as_mask(bias, None), torch.tensor([[False, True], [False, False]]))
    assert torch.equal(_bias_as_mask(bias, torch.tensor([[False, False], [True, False]])),
                       torch.tensor([[False, True], [True, False]]))
    with pytest.raises(NotImplementedError, match="0 / -inf"):
        _bias_as_mask(torch.tensor([[0.0, -1.5]]), None)
