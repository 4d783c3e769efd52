"""check-config says what the build will do with the provider's own settings (issue 46, items 11-13 and the
trainers' megatron-core point): ``full_recompute_policy`` in every layout, a router train pattern next to a
trainer's ``freeze_moe_router`` hook, SkyRL's ``trainer.gradient_checkpointing=false``, megatron-core's recompute
check. Each fails on the main of 2026-12-07: check-config said OK (or predicted an adjustment) for all of them.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from bridge_freeze_plugin.config import load_run
from bridge_freeze_plugin.errors import InvalidFreezeConfigError

NEMO_RL = (Path(__file__).resolve().parents[2] / "fixtures" / "configs" / "nemo_rl" / "examples" / "configs"
           / "vlm_grpo_3B_megatron.yaml")
K = "trainer.policy.megatron_config.transformer_config_kwargs"
MO = "policy.megatron_cfg.model_overrides"
#: (file, overrides, the policy's key) of a run freezing the language model of a Qwen3-VL under full recompute,
#: in each layout: the vision side trains where full recompute breaks its gradients
LAYOUTS = {
    "bridge": (None, ["model.freeze_language_model=true", "model.recompute_granularity=full"],
               "model.full_recompute_policy", "bridge"),
    "nemo_rl": (NEMO_RL, [f"+{MO}.freeze_language_model=true", "policy.megatron_cfg.activation_checkpointing=true",
                          "++policy.megatron_cfg.recompute_granularity=full"], f"+{MO}.full_recompute_policy", None),
    "skyrl": (None, ["trainer.strategy=megatron", f"{K}.freeze_language_model=true"], f"{K}.full_recompute_policy",
              "rl"),
}


@pytest.fixture(autouse=True)
def _skyrl_classes(monkeypatch):
    monkeypatch.delenv("BRIDGE_FREEZE_SKYRL_FIELDS", raising=False)


def run_of(layout: str, *extra: str):
    file, overrides, _, forced = LAYOUTS[layout]
    return load_run(file, [*overrides, *extra], layout=forced, family="qwen3_vl")


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_full_recompute_policy_refuse_is_the_builds_refusal_in_every_layout(layout):
    key = LAYOUTS[layout][2]
    assert len(run_of(layout).adjustments()) == 1  # the default policy: the build's adjustment, said
    with pytest.raises(InvalidFreezeConfigError, match=(
            r"trains the vision_model and vision_projection under full recompute .*full_recompute_policy=refuse.*"
            r"The build refuses it \(InvalidFreezeConfigError\)\. Let the plugin turn recompute off in vision_model")):
        run_of(layout, f"{key}=refuse").validate()
    assert run_of(layout, f"{key}=fix").validate().freeze_language_model is True


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_misspelt_full_recompute_policy_is_refused_in_every_layout(layout):
    key = LAYOUTS[layout][2]
    with pytest.raises(InvalidFreezeConfigError, match=(
            rf"{key.lstrip('+')}=refus .*must be one of fix, refuse.*did you mean {key.lstrip('+')}=refuse\?")):
        run_of(layout, f"{key}=refus").validate()


def test_refuse_with_no_flag_set_only_warns_and_predicts_no_adjustment(caplog):
    """The build with no flag set: a warning, full recompute kept (never "adjusted when the model is built")."""
    run = load_run(None, ["model.recompute_granularity=full", "model.full_recompute_policy=refuse"],
                   layout="bridge", family="qwen3_vl")
    with caplog.at_level(logging.WARNING, logger="bridge_freeze_plugin"):
        run.validate()
    assert run.adjustments() == []
    assert any("the build only warns and keeps full recompute" in r.getMessage() for r in caplog.records)


def test_the_former_policy_name_is_read_too():
    with pytest.raises(InvalidFreezeConfigError, match=r"model\.vision_recompute_policy=refuse"):
        run_of("bridge", "model.vision_recompute_policy=refuse").validate()


# ---- a router train pattern next to a trainer's freeze_moe_router hook (item 12) -------------------------------


ROUTERS = r"train_patterns=[.*mlp\.router\..*]"


@pytest.mark.parametrize(("file", "overrides", "layout"), [
    (NEMO_RL, ["policy.megatron_cfg.freeze_moe_router=true", f"+{MO}.freeze_language_model=true",
               f"+{MO}.{ROUTERS}"], None),
    (None, ["trainer.strategy=megatron", "trainer.policy.megatron_config.freeze_moe_router=true",
            f"{K}.freeze_language_model=true", f"{K}.{ROUTERS}"], "rl"),
])
def test_a_router_train_pattern_next_to_freeze_moe_router_is_refused_as_the_build_refuses_it(file, overrides, layout):
    with pytest.raises(InvalidFreezeConfigError, match=(
            r"trains the MoE routers \(language_model\.decoder\.layers\.0\.mlp\.router\.weight\.\.\.\).*"
            r"freeze_moe_router=true freezes those routers .*FreezeGuaranteeError.*Set .*freeze_moe_router=false")):
        load_run(file, overrides, layout=layout, family="qwen3_vl_moe").validate()
    # the pattern trains more of the frozen language model: the hook only narrows it (the build accepts it)
    wider = [o.replace(ROUTERS, r"train_patterns=[language_model\.decoder\.layers\.0\..*]") for o in overrides]
    assert load_run(file, wider, layout=layout, family="qwen3_vl_moe").validate().train_patterns
    # the language model trains by its flag: the routers' pattern changes nothing the hook contradicts
    trained = [o.replace("freeze_language_model=true", "freeze_language_model=false") for o in overrides]
    assert load_run(file, trained, layout=layout, family="qwen3_vl_moe").validate().freeze_language_model is False


# ---- SkyRL: trainer.gradient_checkpointing=false (item 13), megatron-core's recompute check ----------------------


def test_skyrl_gradient_checkpointing_false_turns_recompute_off_as_its_worker_does():
    """SkyRL's MegatronWorker.init_configs sets recompute_granularity / _method / _num_layers to None when
    trainer.gradient_checkpointing is false: no full recompute, so no adjustment (and no megatron-core check)."""
    on = run_of("skyrl")
    assert len(on.adjustments()) == 1 and "recompute_granularity=full" in on.adjustments()[0]
    off = run_of("skyrl", "trainer.gradient_checkpointing=false")
    assert off.adjustments() == [] and [r.value for r in off.settings.run.recompute] == [None]
    assert off.settings.run.provider_recompute == ()
    assert run_of("skyrl", "trainer.gradient_checkpointing=false", f"{K}.recompute_granularity=selective").validate()


def test_selective_recompute_next_to_skyrls_recompute_num_layers_is_megatron_cores_refusal():
    from megatron.core.transformer.transformer_config import TransformerConfig

    with pytest.raises(ValueError, match="recompute_num_layers must be None"):  # megatron-core itself
        TransformerConfig(num_layers=2, hidden_size=8, num_attention_heads=2, recompute_granularity="selective",
                          recompute_method="uniform", recompute_num_layers=1)
    with pytest.raises(InvalidFreezeConfigError, match=(
            rf"{K}\.recompute_granularity=selective .* with {K}\.recompute_num_layers=1 \(default of the RL \(SkyRL "
            rf"0\.4\.0\) layout\): selective recompute needs recompute_num_layers=null.*Set {K}\.recompute_num_layers"
            r"=null")):
        load_run(None, ["trainer.strategy=megatron", f"{K}.recompute_granularity=selective"], layout="rl").validate()
    fixed = ["trainer.strategy=megatron", f"{K}.recompute_granularity=selective", f"{K}.recompute_num_layers=null",
             f"{K}.recompute_method=null"]
    load_run(None, fixed, layout="rl").validate()
    # SkyRL's own fsdp strategy never builds a Megatron provider: not checked there
    load_run(None, [f"{K}.recompute_granularity=selective"], layout="rl").validate()


def test_megatron_cores_check_leaves_what_is_not_known_to_the_build():
    """Bridge's layout with no file: the provider's own recompute_method / _num_layers are not known here."""
    load_run(None, ["model.recompute_granularity=full"], layout="bridge").validate()
    with pytest.raises(InvalidFreezeConfigError, match=(
            r"model\.recompute_method=null \(override .*\): full recompute needs recompute_method uniform or block; "
            r"megatron-core refuses it")):
        load_run(None, ["model.recompute_granularity=full", "model.recompute_method=null",
                        "model.recompute_num_layers=1"], layout="bridge").validate()
