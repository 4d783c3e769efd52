"""NeMo-RL's GRPO / SFT layout, as data (:class:`~bridge_freeze_plugin.config._layouts.Layout`): its table, its
markers, its OmegaConf resolvers and the settings it reads itself."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bridge_freeze_plugin.config._layout_records import (
    Homes,
    LoraKeys,
    ModelKeys,
    RateKeys,
    StrategyKeys,
    TrainerFacts,
)
from bridge_freeze_plugin.config._layouts import BRIDGE_FIELDS, Layout, Marker, OwnSetting, router_keys

# ---- NeMo-RL (read from NVIDIA-NeMo/RL: nemo_rl/models/megatron/setup.py, nemo_rl/models/policy/__init__.py) -----

_MEGATRON_CFG = "policy.megatron_cfg"
_MODEL_OVERRIDES = "policy.megatron_cfg.model_overrides"
#: The provider fields NeMo-RL copies from ``policy.megatron_cfg`` to the provider, when written
#: (``iter_vlm_config_overrides``); every other provider field goes through ``model_overrides``.
NEMO_RL_PROVIDER_KEYS = ("radio_force_cpe_eval_mode", "freeze_vision_model", "freeze_vision_projection",
                         "freeze_sound_encoder", "freeze_sound_projection")
#: Keys of ``model_overrides`` NeMo-RL refuses (``_validate_model_override_conflicts``: a key annotated on its
#: ``MegatronConfig`` is a first-class setting) that name a setting the rules read, and why / what to write.
_FIRST_CLASS = ("duplicates the first-class setting policy.megatron_cfg.{key}, which NeMo-RL refuses (a ValueError "
                "when the policy is set up). Write policy.megatron_cfg.{key}")
_NEMO_RL_REFUSED_OVERRIDES = {key: _FIRST_CLASS for key in ("freeze_sound_encoder", "freeze_sound_projection",
                                                              "freeze_moe_router", "radio_force_cpe_eval_mode",
                                                              "recompute_granularity")}
_NEMO_RL_FREEZE_CONFIG = OwnSetting(
    "the part its name gives, whole", "NeMo-RL (policy.megatron_cfg.freeze_config: a pre-wrap hook passes it to the "
    "model's freeze())", freezes_parts=True)
_AUTOMODEL_FREEZE = OwnSetting("what NeMo Automodel's freeze_config names", "NeMo-RL's DTensor backend (Automodel)",
                               outside=True)


def _nemo_rl_own(megatron_cfg: str) -> dict[str, Mapping[str, OwnSetting] | OwnSetting]:
    """The freeze settings NeMo-RL reads itself, below one model's ``megatron_cfg`` (the policy's, a teacher's)."""
    # (NeMo-RL passes freeze_sound_encoder / freeze_sound_projection from megatron_cfg to the provider: Bridge's
    # names of the audio flags, read as those flags.)
    return {
        megatron_cfg: {"freeze_moe_router": router_keys("NeMo-RL"), "freeze_config": _NEMO_RL_FREEZE_CONFIG},
        f"{megatron_cfg}.model_overrides": dict(BRIDGE_FIELDS),
        # any key: NeMo-RL passes freeze_config to the model's freeze() as keyword arguments
        f"{megatron_cfg}.freeze_config": _NEMO_RL_FREEZE_CONFIG,
    }


def _nemo_rl_resolvers() -> dict[str, Callable[..., Any]]:
    # NeMo-RL's register_omegaconf_resolvers (nemo_rl/utils/config.py), the same four.
    return {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
            "max": lambda a, b: max(a, b)}


NEMO_RL = Layout(
    name="nemo_rl",
    title="NeMo-RL",
    trainer="NeMo-RL",
    homes=Homes(
        flags=_MEGATRON_CFG,
        # NeMo-RL copies only freeze_vision_model / freeze_vision_projection (and the sound and RADIO fields) from
        # megatron_cfg to the provider; the LM flag and the patterns are provider fields it passes through
        # model_overrides.
        # The audio flags too: NeMo-RL drops policy.megatron_cfg.freeze_audio_model (not one of the five keys it
        # copies); its own names of the audio parts, freeze_sound_encoder / freeze_sound_projection, are copied
        # from megatron_cfg (Bridge's aliases of the audio flags, on Nemotron Omni's provider).
        flag_homes={"freeze_language_model": _MODEL_OVERRIDES, "train_patterns": _MODEL_OVERRIDES,
                    "freeze_patterns": _MODEL_OVERRIDES, "freeze_audio_model": _MODEL_OVERRIDES,
                    "freeze_audio_projection": _MODEL_OVERRIDES},
        alias_homes={"freeze_sound_encoder": _MEGATRON_CFG, "freeze_sound_projection": _MEGATRON_CFG},
        section_notes={
            _MEGATRON_CFG: "NeMo-RL copies from policy.megatron_cfg to the model provider only "
                           f"{', '.join(NEMO_RL_PROVIDER_KEYS)}; any other provider field goes under model_overrides",
            _MODEL_OVERRIDES: "NeMo-RL refuses a model_overrides key that duplicates a first-class "
                              "policy.megatron_cfg setting (a ValueError when the policy is set up)",
        },
        reference_sections=(("teacher", "the distillation teacher"),
                            ("on_policy_distillation", "the distillation teachers")),
        own={**_nemo_rl_own(_MEGATRON_CFG), **_nemo_rl_own("teacher.megatron_cfg"),
             "*dtensor_cfg.automodel_kwargs.freeze_config": _AUTOMODEL_FREEZE,
             "on_policy_distillation*": OwnSetting("a teacher's setting", "NeMo-RL", outside=True)},
        refused={_MODEL_OVERRIDES: _NEMO_RL_REFUSED_OVERRIDES},
        foreign_alias=("NeMo-RL refuses a policy.megatron_cfg key the provider lacks (a ValueError when the policy "
                       "is set up)"),
    ),
    model=ModelKeys(path="policy.model_name", family_from_name=True),
    lora=LoraKeys(section="policy.megatron_cfg.peft", rank="dim", switch="enabled"),
    strategy=StrategyKeys(
        switches=(("policy.megatron_cfg.enabled", "megatron"), ("policy.dtensor_cfg.enabled", "dtensor")),
        fix="policy.megatron_cfg.enabled=true and policy.dtensor_cfg.enabled=false",
        notes={
            "dtensor": "NeMo-RL's DTensor backend builds the policy with Hugging Face / NeMo Automodel, never from a "
                       "Megatron-Bridge model provider, so the flags never reach it (its own freezing is "
                       "policy.dtensor_cfg.automodel_kwargs.freeze_config)",
            "megatron+dtensor": "NeMo-RL refuses a policy with both backends enabled",
        },
        # (model_overrides.recompute_granularity is refused by NeMo-RL: a MegatronConfig annotation)
        recompute=("policy.megatron_cfg.recompute_granularity",),
        recompute_switches={
            "policy.megatron_cfg.recompute_granularity": "policy.megatron_cfg.activation_checkpointing"},
    ),
    rates=RateKeys(refused=(
        "NeMo-RL builds the optimizer with Bridge's setup_optimizer and no optimizer_config_override_provider, so "
        "no per-part learning rate is applied in a NeMo-RL run; remove it (every part trains on "
        "policy.megatron_cfg.optimizer.lr)")),
    run=TrainerFacts(
        unwritten_flags_keep_provider_default=True,
        conversion_cache="policy",
        syncs_weights_with=("grpo",),
        weight_sync_note=(
            "NeMo-RL's Megatron refit exports the whole merged model with Bridge's export_hf_weights at every sync, "
            "so it may well send the full-rank parts too, but no run has yet shown its inference engine generating "
            "from updated full-rank parts next to adapters (docs/rl-weight-sync.md: the rule is lifted per trainer "
            "once one has)"),
        resolves_whole_config=True,
        resolvers=_nemo_rl_resolvers(),
        strict_overrides=True,
    ),
    decides=(Marker(("policy", "grpo")), Marker(("policy", "sft"))),
    hints=(Marker(("policy",)),),
)
