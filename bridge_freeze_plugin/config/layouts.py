"""Config layouts as data: where each setting the rules read lives, and the defaults the rules depend on.

One table per layout, like the families' tables: the trainer's SFT and RL configs (the open-source
RL/SFT trainer this plugin's flags come from: its dataclass defaults, its older Hydra YAML layout) and
Megatron-Bridge's own ``ConfigContainer`` (what Bridge writes as ``run_config.yaml`` in a checkpoint).
A layout is recognised from the file (:func:`detect`), weighing all its evidence: a key only one layout
has (``megatron_config`` / ``strategy`` at the top: SFT; ``trainer``: RL; ``model._target_``: Bridge)
decides; a section several layouts may hold (``optimizer``, ``checkpoint``, ``model.freeze_*``...) is a
hint, said when it conflicts; two deciding layouts are an error. ``--layout`` forces one.
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
    #: top-level sections that mark this layout (hints: other layouts' files may have them too)
    markers: tuple[str, ...] = ()
    #: the section holding the per-part learning rates (``lr_<part>``...); ``None``: the flags' section
    learning_rates: str | None = None
    #: ``_target_`` values the learning-rate section must name to be applied (empty: no ``_target_`` needed)
    learning_rates_targets: tuple[str, ...] = ()

    def key(self, setting: str) -> str:
        return f"{self.flags}.{setting}"

    @property
    def lr_section(self) -> str:
        """Where this layout's runs read per-part learning rates from."""
        return self.learning_rates or self.flags


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
    markers=("strategy", "megatron_config"),
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
    markers=("peft", "ddp", "checkpoint", "scheduler", "rerun_state_machine", "optimizer",
             "optimizer_config_override_provider"),
    # Bridge applies per-part learning rates through the optimizer override provider, never from the provider
    # (model) section: cfg.optimizer_config_override_provider = PartLROverrideProvider(...).
    learning_rates="optimizer_config_override_provider",
    learning_rates_targets=("bridge_freeze_plugin.optim.bridge.PartLROverrideProvider",
                            "bridge_freeze_plugin.optim.PartLROverrideProvider"),
)

LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (SFT, RL, BRIDGE)}


def get(name: str) -> Layout:
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ConfigLoadError(f"unknown layout {name!r}; the layouts are {', '.join(LAYOUTS)}") from None


#: How strongly a key points at a layout: it DECIDES (no other layout has it) or is a HINT (others may).
DECIDES, HINT = 2, 1


@dataclass(frozen=True)
class Evidence:
    """What one config shows of one layout: the keys that decide it, and the hints."""

    layout: Layout
    decides: tuple[str, ...] = ()
    hints: tuple[str, ...] = ()

    @property
    def strength(self) -> int:
        return DECIDES if self.decides else HINT if self.hints else 0

    def why(self) -> str:
        return "; ".join([*self.decides, *(f"{hint} (a hint)" if self.decides else hint for hint in self.hints)])


def evidence(top: Mapping[str, Any]) -> dict[str, Evidence]:
    """Layout name -> what the top-level keys show of it (every layout with any evidence)."""
    model = top.get("model")
    model = model if isinstance(model, Mapping) else {}
    found: dict[str, Evidence] = {}

    def add(layout: Layout, decides: list[str], hints: list[str]) -> None:
        if decides or hints:
            found[layout.name] = Evidence(layout, tuple(decides), tuple(hints))

    sft_top = [k for k in SFT.markers if k in top]
    add(SFT, [f"top-level {', '.join(sft_top)}"] if sft_top else [],
        [f"model.{', model.'.join(k for k in ('path', 'lora', 'language_model_only') if k in model)} (the "
         "trainer's model section)"] if any(k in model for k in ("path", "lora", "language_model_only")) else [])
    add(RL, ["a top-level trainer: section"] if "trainer" in top else [],
        ["a top-level generator: section"] if "generator" in top else [])
    bridge_top = [k for k in BRIDGE.markers if k in top]
    freeze_keys = sorted(str(k) for k in model if str(k).startswith("freeze_"))
    add(BRIDGE, ["model._target_ names a provider class"] if "_target_" in model else [],
        ([f"top-level {', '.join(bridge_top)}"] if bridge_top else [])
        + ([f"model.{', model.'.join(freeze_keys)} (provider fields)"] if freeze_keys else []))
    return found


def detect(top: Mapping[str, Any], what: str) -> tuple[Layout, str]:
    """The layout ``top`` (a config's top-level mapping) is written in, and why; an error when it cannot tell.

    The strongest evidence wins: keys that decide a layout over hints. Two layouts with deciding keys (or, with
    none deciding, two with hints) are an error naming both. Evidence for another layout that lost is said in
    the reason, never silently ignored; a flag or learning rate written where the chosen layout does not read
    it is refused when the settings are read (:func:`bridge_freeze_plugin.config.reading.read_settings`).
    """
    found = evidence(top)
    names = ", ".join(LAYOUTS)
    if not found:
        raise ConfigLoadError(
            f"{what} matches no config layout (top-level keys: {', '.join(map(str, top)) or 'none'}): an SFT "
            "config has strategy / megatron_config (and model.path), an RL config a trainer: section, a Bridge "
            f"ConfigContainer model._target_ (and peft, optimizer...). Name it with --layout ({names})"
        )
    best = max(e.strength for e in found.values())
    top_layouts = [e for e in found.values() if e.strength == best]
    if len(top_layouts) > 1:
        reasons = "; ".join(f"{e.layout.title}: {e.why()}" for e in top_layouts)
        raise ConfigLoadError(
            f"{what} matches several config layouts, and its evidence conflicts ({reasons}); name one with "
            f"--layout ({names}), and move or remove the keys of the other"
        )
    (chosen,) = top_layouts
    return chosen.layout, _reason(chosen, found)


def _reason(chosen: Evidence, found: Mapping[str, Evidence]) -> str:
    others = [e for e in found.values() if e.layout is not chosen.layout]
    if not others:
        return chosen.why()
    conflict = "; ".join(f"{e.why()} suggests the {e.layout.title} layout" for e in others)
    return f"{chosen.why()}; conflicting evidence, outweighed: {conflict}"


def plugin_sections() -> tuple[str, ...]:
    """Every section any layout reads the plugin's keys from (flags, patterns, learning rates, the reference's)."""
    out: list[str] = []
    for layout in LAYOUTS.values():
        for key in (layout.flags, layout.lr_section, layout.reference_flags):
            if key is not None and key not in out:
                out.append(key)
    return tuple(out)
