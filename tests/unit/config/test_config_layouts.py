"""The configs users really have: the trainer's SFT/RL dataclass defaults written out as YAML, its older YAML
layout with a Hydra defaults list (raw and as Hydra composes it), command lines with no file, and
Megatron-Bridge's own ConfigContainer (run_config.yaml). Fixtures: tests/fixtures/configs/ (written for
these tests in the real shapes). Expected verdicts are written here by hand, from the trainer's defaults
(SFT strategy megatron, RL strategy fsdp, transformer_config_kwargs.recompute_granularity full)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from bridge_freeze_plugin import FreezeSelection, InvalidFreezeConfigError, UnsupportedFreezeFlagError
from bridge_freeze_plugin.config._validation import load_config, load_run, validate_bridge_config
from bridge_freeze_plugin.errors import ConfigLoadError

CONFIGS = Path(__file__).parents[2] / "fixtures" / "configs"
SFT = CONFIGS / "sft" / "sft_defaults.yaml"
RL = CONFIGS / "rl_dataclass" / "rl_defaults.yaml"
RL_LEGACY = CONFIGS / "rl_legacy" / "ppo_base.yaml"
RL_COMPOSED = CONFIGS / "rl_composed" / "ppo_composed.yaml"
BRIDGE = CONFIGS / "bridge" / "run_config.yaml"
BRIDGE_LORA = CONFIGS / "bridge" / "run_config_lora.yaml"

POLICY = "trainer.policy.megatron_config"
VISION = FreezeSelection(freeze_vision_model=True)
ALL = FreezeSelection(True, True, True)


def verdict(path, overrides=(), **kwargs) -> FreezeSelection | str:
    try:
        return load_run(path, list(overrides), **kwargs).validate()
    except (InvalidFreezeConfigError, UnsupportedFreezeFlagError) as exc:
        return str(exc)


# ---- layouts recognised from the file; a forced layout must agree ---------------------------------------


@pytest.mark.parametrize(("path", "layout"), [
    (SFT, "sft"), (RL, "rl"), (RL_LEGACY, "rl"), (RL_COMPOSED, "rl"), (BRIDGE, "bridge"), (BRIDGE_LORA, "bridge"),
])
def test_each_fixture_is_recognised(path, layout):
    run = load_run(path)
    assert run.layout.name == layout
    assert run.validate() == (ALL if path == BRIDGE_LORA else FreezeSelection())


def test_an_rl_file_checked_as_sft_is_refused_and_read_right_without_the_option():
    """Before: an RL file without --rl read the SFT paths and said "nothing frozen, valid"."""
    flag = f"{POLICY}.freeze_vision_model=true"
    with pytest.raises(ConfigLoadError, match=r"written in the RL layout .*not the SFT layout"):
        load_run(RL_COMPOSED, [flag], layout="sft")
    with pytest.raises(ConfigLoadError, match=r"written in the SFT layout .*not the RL layout"):
        load_run(SFT, ["megatron_config.freeze_vision_model=true"], layout="rl")
    assert verdict(RL_COMPOSED, [flag]) == VISION  # detected: RL, and the flag is read
    assert load_run(RL_COMPOSED, [flag], layout="rl").validate() == VISION


def test_a_config_matching_no_layout_or_several_is_refused(tmp_path):
    odd = tmp_path / "odd.yaml"
    odd.write_text("learning_rate: 0.1\nepochs: 3\n")
    with pytest.raises(ConfigLoadError, match=r"matches no config layout .*learning_rate, epochs.*--layout"):
        load_run(odd)
    both = tmp_path / "both.yaml"
    both.write_text("strategy: megatron\ntrainer: {strategy: megatron}\n")
    with pytest.raises(ConfigLoadError, match="matches several config layouts"):
        load_run(both)
    with pytest.raises(ConfigLoadError, match="matches no config layout"):
        load_run(None, [])
    assert load_run(odd, layout="sft").validate() == FreezeSelection()  # forced: the file shows no layout


# ---- a command line with no file: the layout's defaults stand in for it ---------------------------------


def test_overrides_only_sft_uses_the_sft_defaults():
    """Before: a flag with no strategy given was refused ("strategy is not set"); SFT defaults to megatron."""
    run = load_run(None, ["megatron_config.freeze_vision_model=true"])
    assert run.layout.name == "sft" and run.validate() == VISION
    assert run.settings.run.strategy.value == "megatron"
    assert run.settings.run.strategy.source == "default of the SFT layout"


def test_overrides_only_rl_uses_the_rl_defaults():
    message = verdict(None, [f"{POLICY}.freeze_vision_model=true"])
    assert "requires strategy=megatron, but trainer.strategy=fsdp (default of the RL layout)" in message
    assert verdict(None, ["trainer.strategy=megatron", f"{POLICY}.freeze_vision_model=true"]) == VISION


@pytest.mark.parametrize(("overrides", "key"), [
    (["megatron_config.freeze_vision_model=true"], "megatron_config"),
    (["trainer.strategy=megatron", f"{POLICY}.freeze_vision_model=true"], POLICY),
])
def test_overrides_only_full_recompute_default_is_checked(overrides, key):
    """Before: recompute_granularity defaults to full in the trainer, but an overrides-only run missed the rule."""
    run = load_run(None, overrides, family="qwen3_vl")
    assert run.validate() == VISION  # adjusted by the build, not refused
    (message,) = run.adjustments()
    assert f"{key}.transformer_config_kwargs.recompute_granularity=full (default of the" in message
    assert "no gradient" in message and "turns full recompute off in vision_model" in message
    off = load_run(None, [*overrides, f"{key}.transformer_config_kwargs.recompute_granularity=null"],
                   family="qwen3_vl")
    assert off.validate() == VISION and off.adjustments() == []


# ---- Hydra's + override on the older layout ----------------------------------------------------------------


def test_plus_override_is_applied_on_the_legacy_layout():
    """Before: +trainer.policy.megatron_config.freeze_vision_model=true was dropped ("nothing frozen")."""
    run = load_run(RL_LEGACY, [f"+{POLICY}.freeze_vision_model=true"])
    assert run.validate() == VISION
    assert run.settings.selection == VISION


# ---- the defaults list is composed ---------------------------------------------------------------------------


def test_defaults_list_pulls_in_the_megatron_sections():
    run = load_run(RL_LEGACY)
    assert run.loaded.composed == ("megatron_config/policy.yaml", "megatron_config/ref.yaml")
    tck = run.settings.run.recompute[1]
    assert (tck.key, tck.value) == (f"{POLICY}.transformer_config_kwargs.recompute_granularity", "full")
    assert tck.source == "ppo_base.yaml's defaults list > megatron_config/policy.yaml"
    # the package in the defaults list wins over the file's own @package header
    assert run.loaded.cfg.trainer.ref.megatron_config.transformer_config_kwargs.recompute_granularity is None
    assert "megatron_config" not in run.loaded.cfg


def test_defaults_list_recompute_is_checked_like_the_composed_file():
    """Before: the raw file showed no megatron section, so full recompute from policy.yaml was missed."""
    flag = [f"+{POLICY}.freeze_vision_model=true"]
    (raw,) = load_run(RL_LEGACY, flag, family="qwen3_vl").adjustments()
    (composed,) = load_run(RL_COMPOSED, flag, family="qwen3_vl").adjustments()
    assert "megatron_config/policy.yaml" in raw and "no gradient" in raw
    assert raw.replace("ppo_base.yaml's defaults list > megatron_config/policy.yaml", "X") == \
        composed.replace("ppo_composed.yaml", "X")
    assert load_config(RL_LEGACY) == load_config(RL_COMPOSED)  # the composition equals Hydra's output


@pytest.mark.parametrize(("defaults", "words"), [
    ("  - megatron_config@trainer.policy.megatron_config: missing\n", "does not exist"),
    ("  - override megatron_config: policy\n", "does not compose"),
    ("  - megatron_config: [policy, ref]\n", "selects several options"),
])
def test_defaults_list_entries_that_cannot_be_composed_are_refused(tmp_path, defaults, words):
    (tmp_path / "megatron_config").mkdir()
    (tmp_path / "megatron_config" / "policy.yaml").write_text("tensor_model_parallel_size: 1\n")
    path = tmp_path / "rl.yaml"
    path.write_text("defaults:\n  - _self_\n" + defaults + "trainer:\n  strategy: megatron\n")
    with pytest.raises(ConfigLoadError, match=words):
        load_run(path)


def test_defaults_list_optional_null_and_self_last(tmp_path):
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "a.yaml").write_text("strategy: fsdp\nseed: 1\n")
    path = tmp_path / "sft.yaml"
    path.write_text("defaults:\n  - extra@_global_: a\n  - optional nothing: here\n  - other: null\n"
                    "strategy: megatron\n")
    cfg = load_config(path)  # no _self_ listed: the file's own values come last and win
    assert cfg.strategy == "megatron" and cfg.seed == 1


# ---- an unknown key next to the flags -----------------------------------------------------------------------


def test_unknown_freeze_key_is_an_error_with_a_suggestion():
    """Before: megatron_config.freeze_llm=true was accepted silently (only near-misspellings were caught)."""
    message = verdict(SFT, ["megatron_config.freeze_llm=true"])
    assert "megatron_config.freeze_llm is neither a freeze flag nor a known setting" in message
    assert "did you mean megatron_config.freeze_language_model" in message
    assert "freeze_language_model" in verdict(RL, [f"{POLICY}.freeze_lm=true"])
    # the trainer's own freeze_* settings are not refused
    assert verdict(SFT, ["megatron_config.freeze_moe_router=true"]) == FreezeSelection()
    assert verdict(BRIDGE, ["model.freeze_mtp_model=True", "model.freeze_vision_model=True"]) == VISION


# ---- language_model_only must agree across the policy, reference model and inference engine -----------------


def test_language_model_only_must_agree():
    """Before: a language-model-only policy with a full-VLM reference model and inference engine was valid."""
    message = verdict(RL, ["trainer.policy.language_model_only=true"])
    assert message.startswith("2 problems")
    assert "trainer.ref.language_model_only=false (rl_defaults.yaml)" in message
    assert "generator.inference_engine.language_model_only=false (rl_defaults.yaml)" in message
    agreeing = ["trainer.policy.language_model_only=true", "trainer.ref.language_model_only=true",
                "generator.inference_engine.language_model_only=true"]
    assert verdict(RL, agreeing) == FreezeSelection()
    # the reference model is only used with a KL term: then only the inference engine must agree
    no_kl = verdict(RL, ["trainer.policy.language_model_only=true", "trainer.algorithm.use_kl_loss=false"])
    assert "inference engine" in no_kl and "reference model" not in no_kl
    # overrides only: the RL defaults (all false) stand in
    assert "2 problems" in verdict(None, ["trainer.policy.language_model_only=true"])


# ---- Bridge's ConfigContainer --------------------------------------------------------------------------------


def test_bridge_run_config_family_comes_from_the_provider_target():
    run = load_run(BRIDGE, ["model.freeze_vision_model=True"])
    assert run.settings.family.name == "qwen3_vl"
    assert run.settings.family_source == "model._target_ (the provider class)"
    assert run.validate() == VISION
    (message,) = load_run(BRIDGE, ["model.freeze_vision_model=True", "model.recompute_granularity=full"]).adjustments()
    assert "model.recompute_granularity=full (override 'model.recompute_granularity=full')" in message
    assert "qwen3_vl" in message


def test_bridge_peft_section_is_lora():
    assert verdict(BRIDGE_LORA) == ALL
    # LoRA with a full-rank projection: valid for a Bridge (SFT) run
    assert verdict(BRIDGE_LORA, ["model.freeze_vision_projection=False"]) == FreezeSelection(True, True, False)
    assert "nothing would train" in verdict(BRIDGE_LORA, ["peft=null"])
    assert verdict(BRIDGE_LORA, ["~peft.dim"]) == ALL  # Bridge's LoRA default dim (32)


def test_bridge_unsupported_provider_target():
    message = verdict(BRIDGE, ["model._target_=my_pkg.models.MyVLMProvider", "model.freeze_vision_model=True"])
    assert message.startswith("model.freeze_vision_model=true was set on the provider model._target_=my_pkg.models.")
    assert "register_family" in message
    assert verdict(BRIDGE, ["model._target_=my_pkg.models.MyVLMProvider"]) == FreezeSelection()


def test_bridge_overrides_only_are_recognised_by_the_provider_fields():
    run = load_run(None, ["model.freeze_vision_model=True"])
    assert run.layout.name == "bridge" and run.validate() == VISION
    assert load_run(None, ["model.path=/ckpt", "megatron_config.freeze_vision_model=true"]).layout.name == "sft"


def test_bridge_api_on_a_plain_mapping():
    cfg = {"model": {"_target_": "megatron.bridge.models.gemma_vl.gemma3_vl_provider.Gemma3VLModelProvider",
                     "freeze_language_model": True}, "peft": None}
    assert validate_bridge_config(cfg) == FreezeSelection(freeze_language_model=True)


# ---- every effective value says where it came from -----------------------------------------------------------


def test_sources_of_every_setting(caplog):
    run = load_run(RL_LEGACY, [f"+{POLICY}.freeze_vision_model=true"])
    s = run.settings
    assert s.run.strategy.source == "ppo_base.yaml"
    assert s.lora_read.rank.source == "ppo_base.yaml"
    assert s.run.language_model_only.source == "default of the RL layout"
    assert s.run.recompute[1].source.endswith("megatron_config/policy.yaml")
    assert run.loaded.source(f"{POLICY}.freeze_vision_model") == f"override '+{POLICY}.freeze_vision_model=true'"
    assert set(run.loaded.defaulted) == {"trainer.policy.language_model_only", "trainer.ref.language_model_only",
                                         "trainer.algorithm.use_kl_in_reward", "trainer.gradient_checkpointing",
                                         "generator.inference_engine.language_model_only"}
    with caplog.at_level(logging.WARNING, logger="bridge_freeze_plugin"):
        run.validate()  # the family is unknown (a hub id): a warning that the provider checks it when built
    assert any("not known from the config" in r.getMessage() for r in caplog.records)


# ---- per-part learning rates next to the flags ---------------------------------------------------------------


def test_per_part_learning_rates_are_read_and_checked_with_the_flags():
    run = load_run(None, ["megatron_config.freeze_vision_model=true", "megatron_config.lr_vision_projection=1e-3",
                          "megatron_config.lr_language_model=0.0"])
    assert run.validate() == VISION
    rates = {p.part: p.lr for p in run.settings.rates.values.parts}
    assert rates == {"vision_projection": 1e-3, "language_model": 0.0}  # 0.0 kept, not dropped as falsy
    rl = load_run(None, ["trainer.strategy=megatron", f"{POLICY}.lr_vision_model=1e-5"])
    assert {p.part: p.lr for p in rl.settings.rates.values.parts} == {"vision_model": 1e-5}


@pytest.mark.parametrize(("overrides", "words"), [
    (["megatron_config.freeze_vision_model=true", "megatron_config.lr_vision_model=1e-3"],
     "megatron_config.lr_vision_model is set, but the vision_model is frozen"),
    (["megatron_config.lr_vison_model=1e-3"], "did you mean megatron_config.lr_vision_model"),
    (["megatron_config.lr_adapters=1e-3"], "LoRA is off"),
    (["megatron_config.lr_vision_model=true"], "megatron_config.lr_vision_model"),
])
def test_per_part_learning_rates_that_would_be_ignored_are_refused(overrides, words):
    from bridge_freeze_plugin.errors import PartLearningRateError

    with pytest.raises(PartLearningRateError, match=re.escape(words)):
        load_run(None, overrides)


# ---- patterns next to the flags --------------------------------------------------------------------------


def test_patterns_are_read_next_to_the_flags_and_checked_up_front():
    from bridge_freeze_plugin.errors import InvalidPatternError

    run = load_run(None, ["megatron_config.freeze_vision_model=true",
                          "megatron_config.train_patterns=[vision_model.decoder.layers.1]"])
    assert run.validate().train_patterns == ("vision_model.decoder.layers.1",)
    one = load_run(None, ["megatron_config.freeze_patterns=language_model.embedding"]).validate()
    assert one.freeze_patterns == ("language_model.embedding",)  # one string is one pattern
    with pytest.raises(InvalidPatternError, match=r"megatron_config: train_patterns entry 'vision_model\.\('"):
        load_run(None, ["megatron_config.train_patterns=[vision_model.(]"])
    with pytest.raises(InvalidFreezeConfigError, match="freeze_patterns must be a list of patterns"):
        load_run(None, ["megatron_config.freeze_patterns=3"])
    # all three flags and no LoRA is fine when train patterns make parts of the frozen model train
    flags = [f"megatron_config.{f}=true" for f in ("freeze_language_model", "freeze_vision_model",
                                                  "freeze_vision_projection")]
    assert load_run(None, [*flags, "megatron_config.train_patterns=[language_model.output_layer]"]).validate()
    with pytest.raises(InvalidFreezeConfigError, match="reference model never trains"):
        load_run(None, ["trainer.strategy=megatron", "trainer.ref.megatron_config.train_patterns=[x]"]).validate()
