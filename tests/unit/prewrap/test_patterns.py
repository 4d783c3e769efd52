"""Train / freeze patterns on top of the three flags (issue 16), on real tiny Bridge models and a plain module.

Expected sets are computed here from parameter names (module names compared with ``startswith``, parts from the
tests' own prefix table in ``_family_parts.py``), never with the plugin's pattern code.
"""

from __future__ import annotations

import re

import pytest
import torch
from _family_parts import PARTS

import bridge_freeze_plugin as bfp
from bridge_freeze_harness.tiny import build_tiny_chunks, make_provider
from bridge_freeze_plugin import FamilySpec, FreezeSelection, apply_selection
from bridge_freeze_plugin.errors import FreezeGuaranteeError, InvalidPatternError, UnmatchedPatternError
from bridge_freeze_plugin.prewrap._model_names import _rename
from bridge_freeze_plugin.request import PatternSet, check_matched, compile_pattern

FLAG_OF = {"language_model": "freeze_language_model", "vision_model": "freeze_vision_model",
           "vision_projection": "freeze_vision_projection"}


def part_of(name: str, family: str = "qwen3_vl") -> str:
    lm, vision, projection = (PARTS[family][p] for p in ("language_model", "vision_model", "vision_projection"))
    if re.match(projection, name):
        return "vision_projection"
    return "vision_model" if re.match(vision, name) else ("language_model" if re.match(lm, name) else "other")


def under(name: str, modules) -> bool:
    return any(name == m or name.startswith(m + ".") for m in modules)


def expected(names, flags: dict, train=(), freeze=(), family="qwen3_vl") -> set[str]:
    """The rule, written out on module names: train module, else freeze module, else the part's flag."""
    frozen_parts = {part for part, flag in FLAG_OF.items() if flags.get(flag)}
    out = set()
    for name in names:
        if under(name, train) or (not under(name, freeze) and part_of(name, family) not in frozen_parts):
            out.add(name)
    return out


def build(family="qwen3_vl", flags=None, train=(), freeze=(), hooks=(), **sizes):
    provider = bfp.make_freezable(make_provider(family, **sizes), FreezeSelection(**(flags or {})))
    provider.train_patterns = list(train)  # provider attributes, read like the flags
    provider.freeze_patterns = list(freeze)
    for hook in hooks:
        provider.register_pre_wrap_hook(hook)
    chunks = build_tiny_chunks(family, provider=provider)
    params = {n: p for c in chunks for n, p in c.named_parameters()}
    return provider, params


def trainable(params) -> set[str]:
    return {n for n, p in params.items() if p.requires_grad}


# --------------------------------------------------------------------------------- syntax (no model)


def test_selection_keeps_the_three_positional_flags_and_compiles_patterns():
    sel = FreezeSelection(True, False, True, train_patterns="language_model.decoder.layers.1")
    assert sel.as_dict() == {"freeze_language_model": True, "freeze_vision_model": False,
                             "freeze_vision_projection": True, "freeze_audio_model": False,
                             "freeze_audio_projection": False}
    assert sel.train_patterns == ("language_model.decoder.layers.1",) and sel.freeze_patterns == ()
    assert sel.provider_attributes() == {**sel.as_dict(), "train_patterns": ["language_model.decoder.layers.1"],
                                         "freeze_patterns": []}
    assert sel.any_set and FreezeSelection(freeze_patterns=[".*router"]).any_set and not FreezeSelection().any_set
    assert sel.describe() == "train vision_model; patterns: train 'language_model.decoder.layers.1'"
    assert FreezeSelection.from_mapping({"freeze_vision_model": True, "train_patterns": ["a"]}) == FreezeSelection(
        freeze_vision_model=True, train_patterns=("a",))


@pytest.mark.parametrize("bad", ["*", "vision_model.(merger", "a[", "(?P<x>a)(?P<x>b)"])
def test_an_invalid_regex_is_an_error_naming_it(bad):
    with pytest.raises(InvalidPatternError, match=re.escape(repr(bad)) + ".*not a valid regular expression"):
        FreezeSelection(freeze_patterns=[bad])


@pytest.mark.parametrize("bad", ["", "  ", 3, None])
def test_an_entry_that_is_not_a_nonempty_string_is_an_error(bad):
    with pytest.raises(InvalidPatternError, match="must be a non-empty string"):
        FreezeSelection(train_patterns=[bad])
    with pytest.raises(InvalidPatternError, match="must be a list"):
        FreezeSelection(train_patterns=5)


def test_the_same_pattern_in_both_lists_is_an_error():
    with pytest.raises(InvalidPatternError, match="in both train_patterns and freeze_patterns"):
        FreezeSelection(train_patterns=["a.b"], freeze_patterns=["a.b", "c"])


def test_a_bad_pattern_on_a_provider_names_the_provider_class():
    class P:
        freeze_patterns = ["(unclosed"]

    with pytest.raises(InvalidPatternError, match=r"^P: freeze_patterns entry '\(unclosed'"):
        FreezeSelection.from_object(P())


@pytest.mark.parametrize(("pattern", "name", "hit"), [
    ("vision_model.merger", "vision_model.merger.linear_fc1.weight", True),   # a module covers its parameters
    ("vision_model.merger", "vision_model.merger_extra.weight", False),       # ... but not a longer name
    ("vision_model.merger", "x.vision_model.merger.weight", False),           # anchored at the start
    ("a.b.weight", "a.b.weight", True),                                        # an exact parameter name
    ("a.b.weight", "a.b.weight_scale", False),
    (r"l\.layers\.(2|3)", "l.layers.3.mlp.weight", True),
    (r"l\.layers\.(2|3)", "l.layers.30.mlp.weight", False),
    (".*router", "l.layers.0.mlp.router.weight", True),
])
def test_patterns_match_whole_parameter_or_module_names(pattern, name, hit):
    assert compile_pattern(pattern, "train").matches(name) is hit


@pytest.mark.parametrize(("flag_trains", "train", "freeze", "trains"), [
    (True, (), (), True), (False, (), (), False),
    (True, (), ("m",), False), (False, ("m",), (), True),
    (True, ("m",), ("m.w",), True), (False, ("m.w",), ("m",), True),  # a train pattern wins over a freeze one
])
def test_the_rule_train_pattern_then_freeze_pattern_then_flag(flag_trains, train, freeze, trains):
    assert PatternSet.of(train, freeze).decide("m.w", flag_trains) is trains


# ------------------------------------------------------------- a plain module with its own family table

FAMILY = FamilySpec(name="toy_vlm", providers=("toy:Provider",), language_model=("lm",), vision_model=("vis",),
                    vision_projection=("vis.proj",), other=("audio",))


def toy() -> torch.nn.Module:
    model = torch.nn.Module()
    model.lm = torch.nn.ModuleDict({"layers": torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(3)]),
                                    "norm": torch.nn.LayerNorm(2)})
    model.vis = torch.nn.ModuleDict({"block": torch.nn.Linear(2, 2), "proj": torch.nn.Linear(2, 3)})
    model.audio = torch.nn.Linear(2, 2)
    model.audio.requires_grad_(False)
    return model


def test_report_counts_what_each_pattern_matched_and_what_changed_per_part():
    model = toy()
    sel = FreezeSelection(freeze_language_model=True, train_patterns=[r"lm\.layers\.2", r"lm\.norm"],
                          freeze_patterns=["vis.proj.bias"])
    report = apply_selection(model, FAMILY, sel)
    assert trainable(dict(model.named_parameters())) == {
        "lm.layers.2.weight", "lm.layers.2.bias", "lm.norm.weight", "lm.norm.bias",
        "vis.block.weight", "vis.block.bias", "vis.proj.weight"}
    patterns = report.as_dict()["patterns"]
    assert patterns["matches"] == [
        {"kind": "freeze", "pattern": "vis.proj.bias", "tensors": 1, "params": 3},
        {"kind": "train", "pattern": r"lm\.layers\.2", "tensors": 2, "params": 6},
        {"kind": "train", "pattern": r"lm\.norm", "tensors": 2, "params": 4},
    ]
    assert patterns["changed"] == {
        "language_model": {"trained": 10, "trained_tensors": 4, "frozen": 0, "frozen_tensors": 0},
        "vision_model": {"trained": 0, "trained_tensors": 0, "frozen": 0, "frozen_tensors": 0},
        "vision_projection": {"trained": 0, "trained_tensors": 0, "frozen": 3, "frozen_tensors": 1},
    }
    text = report.format()
    assert "changed in language_model: 10 trained (4 tensor(s)), 0 frozen (0 tensor(s))" in text
    assert "changed in vision_projection: 0 trained (0 tensor(s)), 3 frozen (1 tensor(s))" in text
    assert "note: the patterns make the whole" not in text


def test_a_pattern_reversing_a_whole_part_is_allowed_and_reported():
    model = toy()
    report = apply_selection(model, FAMILY, FreezeSelection(freeze_vision_projection=True, train_patterns=["vis"]))
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        n for n, _ in model.named_parameters() if not n.startswith("audio.")}
    assert "note: the patterns make the whole vision_projection trainable, contrary to " \
           "freeze_vision_projection=True" in report.format()


def test_other_parameters_are_never_touched_and_a_pattern_only_there_is_an_error():
    model = toy()
    with pytest.raises(UnmatchedPatternError, match=r"'audio' matches nothing \(it matches 2 tensor\(s\) of 'other'"):
        apply_selection(model, FAMILY, FreezeSelection(train_patterns=["audio"]))
    apply_selection(model, FAMILY, FreezeSelection(train_patterns=["lm", ".*"]))  # ".*" matches audio too
    assert not any(p.requires_grad for p in model.audio.parameters())


def test_a_typo_raises_with_the_nearest_real_names():
    model = toy()
    with pytest.raises(UnmatchedPatternError) as info:
        apply_selection(model, FAMILY, FreezeSelection(freeze_patterns=["lm.layer.1", "vis"]))
    assert info.value.patterns == ("lm.layer.1",)  # "vis" matched
    assert info.value.suggestions["lm.layer.1"][0] == "lm.layers.1"
    assert "nearest names: lm.layers.1, " in str(info.value)


def test_model_wide_suggestions_merge_every_ranks_nearest_names():
    class TwoRanks:  # stands in for torch.distributed: rank 1's names are gathered with ours
        def get_world_size(self):
            return 2

        def all_gather_object(self, out, local):
            out[0] = local
            out[1] = {text: [(1.0, "lm.layers.3")] for text in local}

    sel = FreezeSelection(train_patterns=["lm.layers.3x"])
    from bridge_freeze_plugin.request import PatternTally

    summary = PatternTally(sel.patterns, ()).summary()
    with pytest.raises(UnmatchedPatternError, match="in the whole model") as info:
        check_matched(summary, "Toy", ["lm.layers.0.weight"], gather=TwoRanks())
    assert info.value.suggestions["lm.layers.3x"][0] == "lm.layers.3"


def test_model_wide_names_renumber_pipeline_layers_and_expert_parallel_experts():
    segments = {"lm.decoder.layers.0": "2", "lm.decoder.layers.1": "3"}
    experts = {"lm.decoder.layers.1.mlp.experts": 4}
    assert _rename("lm.decoder.layers.0.mlp.linear_fc1.weight", segments, {}) == \
        "lm.decoder.layers.2.mlp.linear_fc1.weight"
    assert _rename("lm.decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight", segments, experts) == \
        "lm.decoder.layers.3.mlp.experts.local_experts.5.linear_fc1.weight"
    assert _rename("lm.decoder.layers.1.mlp.experts.linear_fc2.weight0", segments, experts) == \
        "lm.decoder.layers.3.mlp.experts.linear_fc2.weight4"
    assert _rename("lm.decoder.layers.1.mlp.router.weight", segments, experts) == \
        "lm.decoder.layers.3.mlp.router.weight"


# ------------------------------------------------------------------------------- real tiny Bridge models


def test_last_n_layers_with_the_projection(cpu_bridge):
    flags = {"freeze_language_model": True, "freeze_vision_model": True}
    last_two = ["language_model.decoder.layers.2", "language_model.decoder.layers.3"]
    provider, params = build(flags=flags, train=[r"language_model\.decoder\.layers\.(2|3)"], num_layers=4)
    assert trainable(params) == expected(params, flags, train=last_two)
    assert any(n.startswith("language_model.decoder.layers.3.") for n in trainable(params))
    report = bfp.last_report(provider)
    lm_trained = sum(p.numel() for n, p in params.items() if under(n, last_two))
    assert report.part(bfp.Part.LANGUAGE_MODEL).trainable == lm_trained
    assert report.patterns.change(bfp.Part.LANGUAGE_MODEL).trained == lm_trained


def test_norms_and_embeddings_only(cpu_bridge):
    flags = dict.fromkeys(FLAG_OF.values(), True)
    _, params = build(flags=flags, train=[r"language_model\..*(layernorm|norm)", "language_model.embedding"])
    norms = {n for n in params if n.startswith("language_model.") and re.search(r"(layer)?norm\.(weight|bias)$", n)}
    want = norms | {n for n in params if n.startswith("language_model.embedding.")}
    assert trainable(params) == want
    assert {n.split(".")[-2] for n in norms} == {"input_layernorm", "pre_mlp_layernorm", "q_layernorm",
                                                 "k_layernorm", "final_layernorm"}


def test_router_frozen_on_a_moe_model(cpu_bridge):
    provider, params = build("qwen3_vl_moe", freeze=[r".*\.mlp\.router"])
    routers = {n for n in params if ".mlp.router." in n}
    assert routers and trainable(params) == set(params) - routers
    assert bfp.last_report(provider).patterns.change(bfp.Part.LANGUAGE_MODEL).frozen_tensors == len(routers)


@pytest.mark.parametrize(("flag", "train", "freeze"), [
    ("freeze_language_model", "language_model.decoder.final_layernorm", "vision_model.patch_embed"),
    ("freeze_vision_model", "vision_model.decoder.layers.0", "vision_model.merger.patch_norm"),
    ("freeze_vision_projection", "vision_model.decoder.deepstack_merger_list.1", "language_model.embedding"),
])
def test_patterns_with_each_flag(cpu_bridge, flag, train, freeze):
    flags = {flag: True}
    _, params = build(flags=flags, train=[train], freeze=[freeze])
    want = expected(params, flags, train=[train], freeze=[freeze])
    assert trainable(params) == want
    assert want != expected(params, flags)  # the patterns changed something on both sides
    assert any(under(n, [train]) for n in want) and not any(under(n, [freeze]) for n in want)


def test_a_typo_on_a_real_model_raises_before_training_with_suggestions(cpu_bridge):
    with pytest.raises(UnmatchedPatternError) as info:
        build(flags={"freeze_vision_model": True}, train=["language_model.decoder.layer.1"])
    assert info.value.suggestions["language_model.decoder.layer.1"][0] == "language_model.decoder.layers.1"
    assert "Qwen3VLModelProvider" in str(info.value) and "train_patterns=['language_model.decoder.layer.1']" in str(
        info.value)


def test_an_invalid_pattern_on_a_provider_raises_before_any_build(cpu_bridge):
    provider = bfp.make_freezable(make_provider("qwen3_vl"))
    provider.freeze_patterns = ["*.router"]
    with pytest.raises(InvalidPatternError, match=r"Qwen3VLModelProvider.*'\*\.router'"):
        provider.provide()


def test_the_guarantee_checks_the_patterns(cpu_bridge):
    def unfreeze_final_norm(model):
        for chunk in model:
            for name, param in chunk.named_parameters():
                if name.startswith("language_model.decoder.final_layernorm."):
                    param.requires_grad_(True)
        return model

    with pytest.raises(FreezeGuaranteeError, match=r"final_layernorm.*unfreeze_final_norm"):
        build(freeze=["language_model.decoder.final_layernorm"], hooks=[unfreeze_final_norm])


def lora(targets):
    from megatron.bridge.peft.lora import LoRA

    return LoRA(target_modules=list(targets), dim=4, alpha=8)


def test_with_lora_a_pattern_names_full_rank_parameters_next_to_the_adapters(cpu_bridge):
    flags = dict.fromkeys(FLAG_OF.values(), True)  # adapters only, then the merger at full rank by pattern
    _, params = build(flags=flags, train=["vision_model.merger"], hooks=[lora(["language_model.*linear_qkv"])])
    adapters = {n for n in params if re.search(r"\.adapter\.linear_(in|out)\.weight$", n)}
    assert adapters and all(n.startswith("language_model.") for n in adapters)
    assert trainable(params) == adapters | {n for n in params if n.startswith("vision_model.merger.")}


def test_with_lora_a_pattern_on_a_lora_target_is_an_overlap(cpu_bridge):
    flags = dict.fromkeys(FLAG_OF.values(), True)
    with pytest.raises(bfp.LoraOverlapError, match=r"language_model\.decoder\.layers\.1\.self_attention\.linear_qkv"):
        build(flags=flags, train=[r"language_model\.decoder\.layers\.1"], hooks=[lora(["language_model.*linear_qkv"])])
