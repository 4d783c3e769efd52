"""Config layouts as data: where each setting the rules read lives, and the defaults the rules depend on.

One table per layout, like the families' tables: the trainer's SFT and RL configs (the open-source
RL/SFT trainer this plugin's flags come from: its dataclass defaults, its older Hydra YAML layout) and
Megatron-Bridge's own ``ConfigContainer`` (what Bridge writes as ``run_config.yaml`` in a checkpoint).
A layout is recognised from the file (:func:`detect`); ``--layout`` forces one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge_freeze_plugin.errors import ConfigLoadError


@dataclass(frozen=True)
class Peer:
    """Another component's ``language_model_only`` that must agree with the policy's, when ``used_when`` holds."""

    key: str
    what: str
    #: keys any of which, true, make the component used (empty: always used)
    used_when: tuple[str, ...] = ()


@dataclass(frozen=True)
class Layout:
    name: str
    title: str
    #: the section holding the three flags (and the recompute setting, and other model settings)
    flags: str
    #: dotted keys of the settings the rules read; ``None`` where the layout has no such setting
    strategy: str | None
    language_model_only: str | None
    lora: str
    lora_rank: str
    model_path: str | None
    #: key holding the provider's class path (Bridge's ``_target_``), the family's source there
    provider_target: str | None
    recompute: tuple[str, ...]
    reference_flags: str | None = None
    peers: tuple[Peer, ...] = ()
    #: ``freeze_*`` keys of the flags' section that are real settings of this layout (not ours)
    other_freeze_keys: frozenset[str] = frozenset()
    #: the value a key takes when the config does not write it (the trainer's own defaults)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    #: the rank a present LoRA section has when it writes none (Bridge's ``LoRA.dim``)
    lora_default_rank: int = 0
    #: what a strategy means when the layout has no strategy key
    fixed_strategy: str | None = None
    #: top-level sections that mark this layout
    markers: tuple[str, ...] = ()

    def key(self, setting: str) -> str:
        return f"{self.flags}.{setting}"


#: Other ``freeze_*`` settings of the trainer's ``megatron_config`` (not the plugin's flags).
_TRAINER_FREEZE_KEYS = frozenset({"freeze_moe_router"})
#: Other ``freeze_*`` fields of Bridge model providers (audio, sound, MTP, omni modalities).
_BRIDGE_FREEZE_KEYS = frozenset({
    "freeze_audio_model", "freeze_audio_projection", "freeze_mtp_model", "freeze_sound_model",
    "freeze_sound_projection", "freeze_sound_encoder", "freeze_modality_encoders", "freeze_modality_projections",
})

SFT = Layout(
    name="sft",
    title="SFT",
    flags="megatron_config",
    strategy="strategy",
    language_model_only="model.language_model_only",
    lora="model.lora",
    lora_rank="rank",
    model_path="model.path",
    provider_target=None,
    recompute=(
        "megatron_config.recompute_granularity",
        "megatron_config.transformer_config_kwargs.recompute_granularity",
    ),
    other_freeze_keys=_TRAINER_FREEZE_KEYS,
    defaults={
        "strategy": "megatron",
        "model.lora.rank": 0,
        "megatron_config.transformer_config_kwargs.recompute_granularity": "full",
    },
    markers=("strategy", "megatron_config", "model"),
)

RL = Layout(
    name="rl",
    title="RL",
    flags="trainer.policy.megatron_config",
    strategy="trainer.strategy",
    language_model_only="trainer.policy.language_model_only",
    lora="trainer.policy.model.lora",
    lora_rank="rank",
    model_path="trainer.policy.model.path",
    provider_target=None,
    recompute=(
        "trainer.policy.megatron_config.recompute_granularity",
        "trainer.policy.megatron_config.transformer_config_kwargs.recompute_granularity",
    ),
    reference_flags="trainer.ref.megatron_config",
    peers=(
        Peer("trainer.ref.language_model_only", "the reference model",
             used_when=("trainer.algorithm.use_kl_loss", "trainer.algorithm.use_kl_in_reward")),
        Peer("generator.inference_engine.language_model_only", "the inference engine"),
    ),
    other_freeze_keys=_TRAINER_FREEZE_KEYS,
    defaults={
        "trainer.strategy": "fsdp",
        "trainer.policy.language_model_only": False,
        "trainer.policy.model.lora.rank": 0,
        "trainer.policy.megatron_config.transformer_config_kwargs.recompute_granularity": "full",
        "trainer.ref.language_model_only": False,
        "trainer.algorithm.use_kl_loss": True,
        "trainer.algorithm.use_kl_in_reward": False,
        "generator.inference_engine.language_model_only": False,
    },
    markers=("trainer",),
)

BRIDGE = Layout(
    name="bridge",
    title="Megatron-Bridge ConfigContainer",
    flags="model",
    strategy=None,
    fixed_strategy="megatron",
    language_model_only=None,
    lora="peft",
    lora_rank="dim",
    lora_default_rank=32,
    model_path=None,
    provider_target="model._target_",
    recompute=("model.recompute_granularity",),
    other_freeze_keys=_BRIDGE_FREEZE_KEYS,
    markers=("peft", "ddp", "checkpoint", "scheduler", "rerun_state_machine", "optimizer"),
)

LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (SFT, RL, BRIDGE)}


def get(name: str) -> Layout:
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ConfigLoadError(f"unknown layout {name!r}; the layouts are {', '.join(LAYOUTS)}") from None


def _evidence(top: Mapping[str, Any]) -> dict[str, str]:
    """Layout name -> why the top-level keys point at it."""
    found: dict[str, str] = {}
    model = top.get("model")
    if isinstance(model, Mapping) and "_target_" in model:
        found["bridge"] = "model._target_ names a provider class"
    elif isinstance(model, Mapping) and any(str(k).startswith("freeze_") for k in model):
        found["bridge"] = "model.freeze_* (provider fields)"
    elif bridge := [k for k in BRIDGE.markers if k in top]:
        found["bridge"] = f"top-level {', '.join(bridge)}"
    if "trainer" in top:
        found["rl"] = "a top-level trainer: section"
    if "bridge" not in found and (sft := [k for k in SFT.markers if k in top]):
        found["sft"] = f"top-level {', '.join(sft)}"
    return found


def detect(top: Mapping[str, Any], what: str) -> tuple[Layout, str]:
    """The layout ``top`` (a config's top-level mapping) is written in, and why; an error when not exactly one."""
    found = _evidence(top)
    if len(found) == 1:
        (name, why), = found.items()
        return LAYOUTS[name], why
    names = ", ".join(LAYOUTS)
    if not found:
        raise ConfigLoadError(
            f"{what} matches no config layout (top-level keys: {', '.join(map(str, top)) or 'none'}): an SFT "
            "config has strategy / model / megatron_config, an RL config a trainer: section, a Bridge "
            f"ConfigContainer model._target_ (and peft, optimizer...). Name it with --layout ({names})"
        )
    reasons = "; ".join(f"{LAYOUTS[n].title}: {why}" for n, why in found.items())
    raise ConfigLoadError(f"{what} matches several config layouts ({reasons}); name one with --layout ({names})")
