"""Megatron-Bridge's own ``ConfigContainer`` layout (what Bridge writes as ``run_config.yaml`` in a checkpoint), as
data (:class:`~bridge_freeze_plugin.config._layouts.Layout`)."""

from __future__ import annotations

from collections.abc import Mapping

from bridge_freeze_plugin.config._layout_records import Homes, LoraKeys, ModelKeys, RateKeys, StrategyKeys
from bridge_freeze_plugin.config._layouts import BRIDGE_FIELDS, Layout, Marker

#: Names that look like Bridge fields but are none (a run would drop them: Bridge skips an override key its
#: provider does not have, with a warning), with what to write instead.
_NOT_BRIDGE_FIELDS: Mapping[str, str] = {
    "freeze_sound_model": (
        "is no field of Bridge's providers (freeze_sound_model is an argument of the Nemotron Omni model's freeze(); "
        "its provider field is freeze_sound_encoder), so Bridge would skip it. Write {section}.freeze_sound_encoder"),
    "freeze_moe_router": (
        "is no field of Bridge's providers, so Bridge would skip it: Bridge freezes MoE routers with the function "
        "megatron.bridge.training.utils.train_utils.freeze_moe_router, registered as a pre-wrap hook "
        "(provider.register_pre_wrap_hook(freeze_moe_router)); the build accepts that hook next to the flags"),
}

#: Bridge's LoRA class with its own three freeze switches (``peft.freeze_*``).
VLM_LORA = "megatron.bridge.peft.lora.VLMLoRA"
#: ``VLMLoRA``'s own freeze switches (fields of Bridge's class, named like three of the flags).
VLM_LORA_SWITCHES = ("freeze_language_model", "freeze_vision_model", "freeze_vision_projection")

BRIDGE = Layout(
    name="bridge",
    title="Megatron-Bridge ConfigContainer",
    trainer="Megatron-Bridge",
    homes=Homes(
        flags="model",
        own={"model": BRIDGE_FIELDS},
        refused={"model": _NOT_BRIDGE_FIELDS},
        saves_every_field=True,
        foreign_alias="Bridge's instantiate drops a field its provider class lacks (with a warning)",
    ),
    model=ModelKeys(provider_target="model._target_"),
    lora=LoraKeys(section="peft", rank="dim", default_rank=32, vlm_targets=(VLM_LORA,)),
    strategy=StrategyKeys(fixed="megatron", recompute=("model.recompute_granularity",),
                          provider_recompute=("model.recompute_granularity",)),
    # Bridge applies per-part learning rates through the optimizer override provider, never from the provider
    # (model) section: cfg.optimizer_config_override_provider = PartLROverrideProvider(...).
    rates=RateKeys(section="optimizer_config_override_provider",
                   targets=("bridge_freeze_plugin.optim.bridge.PartLROverrideProvider",
                            "bridge_freeze_plugin.optim.PartLROverrideProvider")),
    decides=(Marker(("model._target_",)),),
    hints=tuple(Marker((key,)) for key in ("peft", "ddp", "checkpoint", "scheduler", "rerun_state_machine",
                                           "optimizer", "optimizer_config_override_provider", "model.freeze_*")),
)
