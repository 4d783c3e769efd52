"""FreezableVLMProvider on real tiny Bridge providers: overrides always apply, errors come before any
build, Bridge's own freeze() is replaced, the report is logged once, chunk lists work."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from _shared import PROJECTION_ONLY, QWEN3_PROJECTION, trainable
from _shared import names as all_names

from bridge_freeze_harness.tiny import build_tiny_chunks, build_tiny_model, make_provider
from bridge_freeze_plugin import (
    FreezableVLMProvider,
    FreezeSelection,
    Part,
    UnclassifiedParameterError,
    UnsupportedFreezeFlagError,
    apply_selection,
    get_family,
    make_freezable,
)
from bridge_freeze_plugin.prewrap import declared_default


def test_projection_only_on_qwen3_vl_leaves_exactly_the_mergers(cpu_bridge):
    provider = make_freezable(make_provider("qwen3_vl"), PROJECTION_ONLY)
    chunks = build_tiny_chunks("qwen3_vl", provider=provider)
    names = all_names(chunks)
    expected = {n for n in names if QWEN3_PROJECTION.match(n)}
    assert any(".deepstack_merger_list." in n for n in expected)
    assert any(n.startswith("vision_model.merger.") for n in expected)
    assert trainable(chunks) == expected


def test_moe_default_trains_everything_and_logs_the_overridden_defaults(cpu_bridge, caplog):
    from megatron.bridge.models.qwen_vl.qwen3_vl_provider import Qwen3VLMoEModelProvider

    # Bridge's own default: LM and vision encoder frozen (as Bridge declares it; the plugin, active
    # since it was imported, has made False the class default and remembers the original).
    assert declared_default(Qwen3VLMoEModelProvider, "freeze_language_model") is True
    assert declared_default(Qwen3VLMoEModelProvider, "freeze_vision_model") is True
    stock = make_provider("qwen3_vl_moe")
    stock.freeze_language_model = stock.freeze_vision_model = True  # as Bridge would have built it

    provider = make_freezable(stock)  # the config is all-false: it must win
    with caplog.at_level(logging.INFO, logger="bridge_freeze_plugin"):
        chunks = build_tiny_chunks("qwen3_vl_moe", provider=provider)
    assert trainable(chunks) == all_names(chunks)
    blocks = [r.getMessage() for r in caplog.records if r.name == "bridge_freeze_plugin"]
    assert len(blocks) == 1
    assert (
        "provider defaults overridden: freeze_language_model=True replaced by False, "
        "freeze_vision_model=True replaced by False"
    ) in blocks[0]


def test_dataclass_mixin_subclass_defaults_to_false_and_records_override(cpu_bridge):
    from megatron.bridge.models.qwen_vl.qwen3_vl_provider import Qwen3VLMoEModelProvider

    @dataclasses.dataclass
    class MyMoE(FreezableVLMProvider, Qwen3VLMoEModelProvider):
        pass

    base = make_provider("qwen3_vl_moe")
    kwargs = {f.name: getattr(base, f.name) for f in dataclasses.fields(Qwen3VLMoEModelProvider) if f.init}
    for flag in ("freeze_language_model", "freeze_vision_model", "freeze_vision_projection"):
        kwargs.pop(flag)
    provider = MyMoE(**kwargs)
    assert provider.freeze_selection == FreezeSelection()
    report = provider.freeze_report(build_tiny_model("qwen3_vl_moe", provider=provider))
    assert [str(o) for o in report.overridden_defaults] == [
        "freeze_language_model=True replaced by False",
        "freeze_vision_model=True replaced by False",
    ]
    assert report.trainable == report.total


def test_user_subclass_of_a_known_provider_is_that_family(cpu_bridge):
    from megatron.bridge.models.qwen_vl.qwen3_vl_provider import Qwen3VLModelProvider

    @dataclasses.dataclass
    class MyQwen(Qwen3VLModelProvider):
        pass

    base = make_provider("qwen3_vl")
    provider = MyQwen(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init})
    provider.finalize()
    make_freezable(provider, PROJECTION_ONLY)
    assert provider.freeze_family().name == "qwen3_vl"
    model = build_tiny_model("qwen3_vl", provider=provider)
    assert trainable(model) == {n for n in all_names(model) if QWEN3_PROJECTION.match(n)}


def test_flag_on_an_unsupported_provider_raises_before_building(cpu_bridge, mocker):
    from megatron.bridge.models.gpt_provider import GPTModelProvider

    provider = GPTModelProvider(num_layers=1, hidden_size=8, num_attention_heads=1, hf_model_id="acme/text-7b")
    with pytest.raises(UnsupportedFreezeFlagError) as err:
        make_freezable(provider, FreezeSelection(freeze_vision_model=True))
    message = str(err.value)
    assert "freeze_vision_model=True" in message
    assert "megatron.bridge.models.gpt_provider.GPTModelProvider" in message
    assert "acme/text-7b" in message
    assert "qwen3_vl (Qwen3VLModelProvider)" in message  # lists the supported families
    assert "register_family" in message

    # Set after the fact: provide() refuses before Bridge builds anything.
    make_freezable(provider)
    provider.freeze_language_model = True
    build = mocker.spy(GPTModelProvider, "provide")
    with pytest.raises(UnsupportedFreezeFlagError, match="freeze_language_model=True"):
        provider.provide()
    assert build.call_count == 0


def test_unsupported_provider_without_flags_is_left_alone(cpu_bridge):
    from megatron.bridge.models.gpt_provider import GPTModelProvider

    provider = make_freezable(GPTModelProvider(num_layers=1, hidden_size=8, num_attention_heads=1))
    assert provider.freeze_family() is None
    assert provider.freeze_selection == FreezeSelection()


def test_unclassified_parameter_raises_with_its_name_while_a_flag_is_set(cpu_bridge):
    import torch

    model = build_tiny_model("qwen3_vl")
    model.extra_head = torch.nn.Linear(2, 2)
    family = get_family("qwen3_vl")
    with pytest.raises(UnclassifiedParameterError) as err:
        apply_selection(model, family, FreezeSelection(freeze_vision_model=True), provider_name="Qwen3VL")
    assert "extra_head.weight" in str(err.value) and "extra_head.bias" in str(err.value)
    assert "freeze_vision_model=True" in str(err.value)
    # With no flag set nothing is guessed either: the parameter is reported as "other" and untouched.
    report = apply_selection(model, family, FreezeSelection())
    assert report.part(Part.OTHER).total == 2 * 2 + 2


def test_idempotent_and_logged_once(cpu_bridge, caplog):
    provider = make_freezable(make_provider("qwen3_vl"), PROJECTION_ONLY)
    with caplog.at_level(logging.INFO, logger="bridge_freeze_plugin"):
        chunks = build_tiny_chunks("qwen3_vl", provider=provider)
        first = trainable(chunks)
        provider.bridge_freeze_pre_wrap_hook(chunks)
        provider.bridge_freeze_pre_wrap_hook(chunks)
    assert trainable(chunks) == first
    assert len([r for r in caplog.records if r.name == "bridge_freeze_plugin"]) == 1


def test_report_counts_and_format(cpu_bridge):
    provider = make_freezable(make_provider("qwen3_vl"), PROJECTION_ONLY)
    model = build_tiny_model("qwen3_vl", provider=provider)
    report = provider.freeze_report(model)
    names = dict(model.named_parameters())
    proj = sum(p.numel() for n, p in names.items() if QWEN3_PROJECTION.match(n))
    assert report.part(Part.VISION_PROJECTION).trainable == proj
    assert report.trainable == proj
    assert report.total == sum(p.numel() for p in model.parameters())
    assert report.part(Part.LANGUAGE_MODEL).trainable == 0
    text = report.format()
    assert "vision_projection" in text and "total" in text and "100.0%" in text
    # header, column titles, 3 parts, total, then where each of the 3 flags came from: no per-parameter lines
    assert len(text.splitlines()) == 6 + 3
    assert text.splitlines()[6:] == ["  freeze_language_model=true: this run's setting",
                                     "  freeze_vision_model=true: this run's setting",
                                     "  freeze_vision_projection=false: this run's setting"]  # make_freezable wrote all
    assert report.as_dict()["selection"] == {  # the family's flags only (no audio side: no audio flag)
        "freeze_language_model": True, "freeze_vision_model": True, "freeze_vision_projection": False}


def test_chunk_list_and_a_chunk_without_vision_encoder(cpu_bridge):
    """Virtual-pipeline style: a list of chunks, the later one holding only language-model layers."""
    provider = make_freezable(make_provider("qwen3_vl"), FreezeSelection(freeze_language_model=True))
    first = build_tiny_model("qwen3_vl", provider=provider)
    provider.add_encoder = False
    try:
        later = build_tiny_model("qwen3_vl", provider=provider)
    finally:
        provider.add_encoder = True
    assert not any(n.startswith("vision_model.") for n in all_names(later))
    chunks = [first, later]
    report = provider.freeze_report(chunks)
    assert trainable(later) == set()
    assert trainable(first) == {n for n in all_names(first) if n.startswith("vision_model.")}
    assert report.total == sum(p.numel() for c in chunks for p in c.parameters())


def test_a_deep_copied_provider_freezes_by_its_own_flags(cpu_bridge):
    import copy

    original = make_freezable(make_provider("qwen3_vl"), PROJECTION_ONLY)
    build_tiny_chunks("qwen3_vl", provider=original)  # creates and caches the pre-wrap hook
    clone = copy.deepcopy(original)
    clone.freeze_language_model = False  # the clone trains the language model too
    chunks = build_tiny_chunks("qwen3_vl", provider=clone)
    names = all_names(chunks)
    assert trainable(chunks) == {n for n in names if QWEN3_PROJECTION.match(n) or n.startswith("language_model.")}
    assert original.freeze_language_model is True


# ---- full activation recompute with a training vision side (Qwen3-VL family) ---------------------------

FULL_RECOMPUTE = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}


def _plugin_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "bridge_freeze_plugin" and r.levelno == logging.WARNING]


def _recompute(config) -> tuple:
    return (config.recompute_granularity, config.recompute_method, config.recompute_num_layers)


@pytest.mark.parametrize("selection", [FreezeSelection(freeze_vision_model=True), PROJECTION_ONLY,
                                       FreezeSelection(freeze_vision_projection=True), FreezeSelection()],
                         ids=["projection+lm", "projection-only", "encoder+lm", "no-flag"])
def test_full_recompute_is_turned_off_in_the_vision_tower_only_and_reported(cpu_bridge, caplog, selection):
    from bridge_freeze_plugin import last_report

    caplog.set_level(logging.INFO, logger="bridge_freeze_plugin")
    provider = make_freezable(make_provider("qwen3_vl", **FULL_RECOMPUTE), selection)
    model = build_tiny_model("qwen3_vl", provider=provider)
    vision_configs = {id(m.config): m.config for _, m in model.vision_model.named_modules() if hasattr(m, "config")}
    assert vision_configs and all(_recompute(c) == (None, None, None) for c in vision_configs.values())
    assert _recompute(model.language_model.config) == ("full", "uniform", 1)  # the language model keeps it
    assert _recompute(provider) == ("full", "uniform", 1)  # the user's config is not rewritten
    (note,) = last_report(provider).notes
    assert "turned off in vision_model" in note and "DeepStack" in note
    assert _plugin_warnings(caplog) == []


def test_full_recompute_with_the_vision_side_frozen_or_another_family_is_left_alone(cpu_bridge):
    from bridge_freeze_plugin import last_report

    frozen_vision = FreezeSelection(freeze_vision_model=True, freeze_vision_projection=True)
    provider = make_freezable(make_provider("qwen3_vl", **FULL_RECOMPUTE), frozen_vision)
    model = build_tiny_model("qwen3_vl", provider=provider)
    assert _recompute(model.vision_model.config) == ("full", "uniform", 1)
    assert last_report(provider).notes == ()
    # Gemma3-VL's vision tower has no checkpointed side outputs: nothing is changed there
    gemma = make_freezable(make_provider("gemma3_vl", **FULL_RECOMPUTE), PROJECTION_ONLY)
    gemma_model = build_tiny_model("gemma3_vl", provider=gemma)
    assert trainable(gemma_model) == {n for n in all_names(gemma_model) if n.startswith("multi_modal_projector.")}
    assert last_report(gemma).notes == ()


def test_the_refuse_policy_raises_before_building(cpu_bridge, mocker):
    from megatron.bridge.models.qwen_vl.qwen3_vl_provider import Qwen3VLModelProvider

    from bridge_freeze_plugin import InvalidFreezeConfigError

    for selection in (FreezeSelection(freeze_vision_model=True), FreezeSelection(freeze_vision_projection=True)):
        provider = make_freezable(make_provider("qwen3_vl", **FULL_RECOMPUTE), selection)
        provider.full_recompute_policy = "refuse"
        provider.hf_model_id = "Qwen/Qwen3-VL-4B-Instruct"
        build = mocker.spy(Qwen3VLModelProvider, "provide")
        for call in (provider.provide, lambda p=provider: build_tiny_chunks("qwen3_vl", provider=p)):
            with pytest.raises(InvalidFreezeConfigError) as err:
                call()
            message = str(err.value)
            for word in (selection.set_flags()[0] + "=True", "Qwen3VLModelProvider", "Qwen/Qwen3-VL-4B-Instruct",
                         "recompute_granularity=full", "DeepStack", "recompute_granularity=None",
                         "freeze_vision_projection=True", "full_recompute_policy"):
                assert word in message, (word, message)
        assert build.call_count == 0
        mocker.stopall()


def test_the_refuse_policy_with_no_flag_only_warns_once(cpu_bridge, caplog):
    caplog.set_level(logging.INFO, logger="bridge_freeze_plugin")
    provider = make_freezable(make_provider("qwen3_vl", **FULL_RECOMPUTE))
    provider.full_recompute_policy = "refuse"
    model = build_tiny_model("qwen3_vl", provider=provider)
    assert trainable(model) == all_names(model)  # installing the plugin never breaks such a run
    assert _recompute(model.vision_model.config) == ("full", "uniform", 1)  # refused means: not changed
    build_tiny_model("qwen3_vl", provider=provider)
    warnings = _plugin_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "no freeze flag" in warnings[0] and "recompute_granularity=full" in warnings[0]


def test_an_unknown_recompute_policy_is_refused(cpu_bridge):
    from bridge_freeze_plugin import InvalidFreezeConfigError

    provider = make_freezable(make_provider("qwen3_vl", **FULL_RECOMPUTE))
    provider.full_recompute_policy = "ignore"
    with pytest.raises(InvalidFreezeConfigError, match="full_recompute_policy='ignore'"):
        provider.provide(True, True)


def test_the_former_policy_name_is_still_read(cpu_bridge):
    """``vision_recompute_policy`` (before the rename; a run_config.yaml written then has it): "refuse" under it
    refuses, and a bad value under it is named."""
    from bridge_freeze_plugin import InvalidFreezeConfigError

    provider = make_freezable(make_provider("qwen3_vl", **FULL_RECOMPUTE), FreezeSelection(freeze_vision_model=True))
    assert (provider.full_recompute_policy, provider.vision_recompute_policy) == ("fix", None)
    provider.vision_recompute_policy = "refuse"
    with pytest.raises(InvalidFreezeConfigError, match="full_recompute_policy='refuse'"):
        provider.provide(True, True)
    provider.vision_recompute_policy = "sometimes"
    with pytest.raises(InvalidFreezeConfigError, match="vision_recompute_policy='sometimes'"):
        provider.provide(True, True)


def test_last_report_after_a_plain_provide(cpu_bridge):
    """The structured report is kept on the provider after provide() too, not only provide_distributed_model()."""
    from bridge_freeze_plugin import last_report

    provider = make_provider("qwen3_vl")  # a plain (activation-patched) Bridge provider
    provider.freeze_language_model = True
    model = build_tiny_model("qwen3_vl", provider=provider)
    report = last_report(provider)
    assert report is not None and report.selection == FreezeSelection(freeze_language_model=True)
    rows = {row.part: row for row in report.parts}
    lm = {n: p.numel() for n, p in model.named_parameters() if n.startswith("language_model.")}
    assert (rows[Part.LANGUAGE_MODEL].trainable, rows[Part.LANGUAGE_MODEL].total) == (0, sum(lm.values()))
    assert rows[Part.VISION_MODEL].trainable == rows[Part.VISION_MODEL].total > 0
