"""The trainer's SFT and RL layouts (the open-source RL/SFT trainer this plugin's flags come from: its dataclass
defaults, its older Hydra YAML layout), as data (:class:`~bridge_freeze_plugin.config._layouts.Layout`)."""

from __future__ import annotations

from bridge_freeze_plugin.config._layout_records import Homes, LoraKeys, ModelKeys, Peer, StrategyKeys, TrainerFacts
from bridge_freeze_plugin.config._layouts import Layout, Marker, bridge_field_elsewhere, router_keys

#: The trainer's LoRA targets as its Megatron worker hands them to Bridge's LoRA (SkyRL 0.4.0's
#: ``MegatronWorker.configure_lora``): ``"all-linear"`` (its default) becomes these leaf names, matched in every
#: part that has modules of those names. (The worker drops ``in_proj`` for a model whose bridge maps a GatedDeltaNet
#: ``in_proj`` to two fused HF tensors, Qwen3-Next's layout; no registered family has it.) ``canonical_lora``'s list
#: names the same modules (``linear_q``... are read as the module they split).
ALL_LINEAR = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2", "in_proj", "out_proj")
#: SkyRL's MegatronConfig.__post_init__ sets these transformer_config_kwargs items where the config writes none
#: (its DEFAULT_TRANSFORMER_CONFIG_KWARGS' recompute part)
def _SKYRL_RECOMPUTE_DEFAULTS(kwargs: str) -> dict[str, object]:
    return {f"{kwargs}.recompute_granularity": "full", f"{kwargs}.recompute_method": "uniform",
            f"{kwargs}.recompute_num_layers": 1}


_CHECKPOINTING = "trainer.gradient_checkpointing"
_RL_RECOMPUTE = ("trainer.policy.megatron_config.recompute_granularity",
                 "trainer.policy.megatron_config.transformer_config_kwargs.recompute_granularity")
_LORA_NAMES = {"target_aliases": {"all-linear": ALL_LINEAR}, "default_target": "all-linear"}

SFT = Layout(
    name="sft",
    title="SFT",
    trainer="the trainer",
    homes=Homes(
        flags="megatron_config",
        own={"megatron_config": {"freeze_moe_router": router_keys("the trainer")}},
        refused={"megatron_config": bridge_field_elsewhere("the trainer")},
    ),
    model=ModelKeys(path="model.path", language_model_only="model.language_model_only"),
    lora=LoraKeys(section="model.lora", rank="rank", type="megatron_config.lora_config.lora_type", **_LORA_NAMES),
    strategy=StrategyKeys(key="strategy", recompute=(
        "megatron_config.recompute_granularity",
        "megatron_config.transformer_config_kwargs.recompute_granularity",
    ), provider_recompute=("megatron_config.transformer_config_kwargs.recompute_granularity",)),
    run=TrainerFacts(
        defaults={
            "strategy": "megatron",
            "model.lora.rank": 0,
            **_SKYRL_RECOMPUTE_DEFAULTS("megatron_config.transformer_config_kwargs"),
        },
        skyrl="sft",
    ),
    decides=(Marker(("strategy",)), Marker(("megatron_config",))),
    hints=(Marker(("model.path",)), Marker(("model.lora",)), Marker(("model.language_model_only",))),
)

RL = Layout(
    name="rl",
    title="RL",
    trainer="the trainer",
    homes=Homes(
        flags="trainer.policy.megatron_config",
        reference_flags="trainer.ref.megatron_config",
        own={"trainer.policy.megatron_config": {"freeze_moe_router": router_keys("the trainer")},
             "trainer.ref.megatron_config": {"freeze_moe_router": router_keys("the trainer")}},
        refused={"trainer.policy.megatron_config": bridge_field_elsewhere("the trainer")},
    ),
    model=ModelKeys(
        path="trainer.policy.model.path",
        language_model_only="trainer.policy.language_model_only",
        peers=(
            Peer("trainer.ref.language_model_only", "the reference model",
                 used_when=("trainer.algorithm.use_kl_loss", "trainer.algorithm.use_kl_in_reward")),
            Peer("generator.inference_engine.language_model_only", "the inference engine"),
        ),
    ),
    lora=LoraKeys(section="trainer.policy.model.lora", rank="rank",
                  type="trainer.policy.megatron_config.lora_config.lora_type", **_LORA_NAMES),
    strategy=StrategyKeys(key="trainer.strategy", recompute=_RL_RECOMPUTE,
                          # SkyRL's MegatronWorker.init_configs: trainer.gradient_checkpointing=false sets
                          # recompute_granularity / _method / _num_layers of transformer_config_kwargs to None
                          recompute_switches={key: _CHECKPOINTING for key in _RL_RECOMPUTE},
                          recompute_switches_on_by_default=True,
                          provider_recompute=(_RL_RECOMPUTE[1],)),
    run=TrainerFacts(
        defaults={
            "trainer.strategy": "fsdp",
            "trainer.policy.language_model_only": False,
            "trainer.policy.model.lora.rank": 0,
            **_SKYRL_RECOMPUTE_DEFAULTS("trainer.policy.megatron_config.transformer_config_kwargs"),
            _CHECKPOINTING: True,
            "trainer.ref.language_model_only": False,
            "trainer.algorithm.use_kl_loss": True,
            "trainer.algorithm.use_kl_in_reward": False,
            "generator.inference_engine.language_model_only": False,
        },
        syncs_weights=True,
        skyrl="rl",
    ),
    decides=(Marker(("trainer",)),),
    hints=(Marker(("generator",)),),
)
