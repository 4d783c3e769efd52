"""Config layouts as data: where each setting the rules read lives, and the defaults the rules depend on.

One table per layout, like the families' tables, each in its trainer's module: the trainer's SFT and RL configs
(:mod:`._layout_sft_rl`), Megatron-Bridge's own ``ConfigContainer`` (what Bridge writes as ``run_config.yaml`` in a
checkpoint: :mod:`._layout_bridge`) and NeMo-RL's GRPO / SFT configs (:mod:`._layout_nemorl`); this module holds
:class:`Layout` itself and what several tables share. A layout is recognised from the file
(:func:`._layout_detect.detect`), weighing all its evidence: keys only one layout has (its :attr:`Layout.decides`
markers) decide; keys several layouts may hold (:attr:`Layout.hints`) are hints, said when they conflict; two
deciding layouts are an error. ``--layout`` forces one. What a rule needs to know about a layout is a field here
(``syncs_weights``, the strategy switches...), never a test of its name: a new layout is a new table.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

from bridge_freeze_plugin.request import ALIASES, Part


@dataclass(frozen=True)
class Peer:
    """Another component's ``language_model_only`` that must agree with the policy's, when ``used_when`` holds."""

    key: str
    what: str
    #: keys any of which, true, make the component used (empty: always used)
    used_when: tuple[str, ...] = ()


@dataclass(frozen=True)
class OwnSetting:
    """A ``freeze_*`` setting that is not one of the plugin's flags: Bridge's or a trainer's own, applied by them.

    Read and said (never refused, never applied by the plugin).
    """

    #: what it freezes
    what: str
    #: who applies it, and how
    by: str
    #: the part inside which it freezes some tensors through a pre-wrap hook (the build reports it per part)
    narrows: Part | None = None
    #: it freezes modules outside the plugin's parts (MTP, MIMO's modality parts...)
    outside: bool = False
    #: it is a pre-wrap hook that freezes whole parts named like the plugin's flags (NeMo-RL's freeze_config)
    freezes_parts: bool = False


@dataclass(frozen=True)
class Marker:
    """Keys that, all present, point at a layout. A last segment ending in ``*`` matches any key it starts."""

    keys: tuple[str, ...]

    def found(self, top: Mapping[str, Any]) -> list[str] | None:
        """The keys as found in ``top`` (a config's top-level mapping), or ``None`` when one is missing."""
        out: list[str] = []
        for key in self.keys:
            hits = _present(top, key)
            if not hits:
                return None
            out += hits
        return out


def _present(top: Mapping[str, Any], key: str) -> list[str]:
    node: Any = top
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.get(part) if isinstance(node, Mapping) else None
        if not isinstance(node, Mapping):
            return []
    last = parts[-1]
    if last.endswith("*"):
        prefix = ".".join(parts[:-1])
        return sorted(f"{prefix}.{k}" if prefix else str(k) for k in node if str(k).startswith(last[:-1]))
    return [key] if last in node else []


@dataclass(frozen=True)
class Layout:
    name: str
    title: str
    #: who runs configs of this layout (messages: "the trainer", "Megatron-Bridge", "NeMo-RL")
    trainer: str
    #: the section holding the flags and patterns (and other model settings)
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
    #: a plugin key (flag or pattern key) -> the section it goes in, when not :attr:`flags`
    flag_homes: Mapping[str, str] = field(default_factory=dict)
    #: Bridge's name of a flag (an alias, ``freeze_sound_encoder``) -> the section it goes in, when not the flag's
    alias_homes: Mapping[str, str] = field(default_factory=dict)
    #: a section the plugin's keys may go in -> why a plugin key homed elsewhere is not applied there
    section_notes: Mapping[str, str] = field(default_factory=dict)
    #: ((key, strategy), ...): the strategy is the one whose key is true (NeMo-RL's ``enabled`` switches)
    strategy_switches: tuple[tuple[str, str], ...] = ()
    #: what to write for the Megatron strategy (default: ``<strategy key>=megatron``)
    strategy_fix: str | None = None
    #: a strategy -> why the flags cannot apply under it (said in the refusal)
    strategy_notes: Mapping[str, str] = field(default_factory=dict)
    #: the key of the LoRA section that turns it on (NeMo-RL's ``peft.enabled``); ``None``: present is on
    lora_switch: str | None = None
    #: ``_target_`` values of the LoRA section that are Bridge's ``VLMLoRA`` (its own freeze switches)
    vlm_lora_targets: tuple[str, ...] = ()
    #: a recompute key -> the switch that must be true for it to apply (NeMo-RL's ``activation_checkpointing``)
    recompute_switches: Mapping[str, str] = field(default_factory=dict)
    #: the model path may be a hub id: map its name to a family, said to be a guess
    family_from_name: bool = False
    #: a flag the config does not write keeps the model provider's own default (NeMo-RL passes only what is
    #: written); otherwise it is false (the trainer writes every flag)
    unwritten_flags_keep_provider_default: bool = False
    reference_flags: str | None = None
    #: ((section, what), ...): components that never train; a plugin key anywhere below them is refused
    reference_sections: tuple[tuple[str, str], ...] = ()
    peers: tuple[Peer, ...] = ()
    #: section (fnmatch pattern over the dotted path) -> its ``freeze_*`` settings that are not the plugin's (one
    #: :class:`OwnSetting` alone: every ``freeze_*`` key of the section is one)
    own: Mapping[str, Mapping[str, OwnSetting] | OwnSetting] = field(default_factory=dict)
    #: section -> ``freeze_*`` names that are no setting there, with why and what to write instead
    refused: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: the value a key takes when the config does not write it (the trainer's own defaults)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    #: the rank a present LoRA section has when it writes none (Bridge's ``LoRA.dim``)
    lora_default_rank: int = 0
    #: a ``target_modules`` value the trainer's worker replaces by Megatron leaf names before Bridge's LoRA sees it
    #: (SkyRL's ``"all-linear"``), and the value it has when the config writes none (``None``: Bridge's default)
    lora_target_aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    lora_default_target: str | None = None
    #: the key naming the LoRA class (SkyRL's ``lora_type``: ``"canonical_lora"`` is Bridge's ``CanonicalLoRA``)
    lora_type: str | None = None
    #: what a strategy means when the layout has no strategy key
    fixed_strategy: str | None = None
    #: keys that decide this layout (no other layout has them), and hints (other layouts' files may have them)
    decides: tuple[Marker, ...] = ()
    hints: tuple[Marker, ...] = ()
    #: the section holding the per-part learning rates (``lr_<part>``...); ``None``: the flags' section
    learning_rates: str | None = None
    #: ``_target_`` values the learning-rate section must name to be applied (empty: no ``_target_`` needed)
    learning_rates_targets: tuple[str, ...] = ()
    #: why no per-part learning rate can apply in this layout's runs (``None``: they can)
    learning_rates_refused: str | None = None
    #: the run syncs the policy's weights to an inference engine (RL rollouts): always, or when one of
    #: ``syncs_weights_with`` (top-level sections) is present
    syncs_weights: bool = False
    syncs_weights_with: tuple[str, ...] = ()
    #: why LoRA with full-rank parts is refused for this trainer's weight sync (``None``: the rule's own words)
    weight_sync_note: str | None = None
    #: the trainer resolves every interpolation of the config at start (one that fails stops the run)
    resolves_whole_config: bool = False
    #: OmegaConf resolvers the trainer registers (name -> function), used while reading
    resolvers: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    #: ``key=value`` must name a key the config has (Hydra's struct mode: ``+key=value`` adds)
    strict_overrides: bool = False
    #: SkyRL's layout: its root class in SkyRL's field listing (``config._skyrl_fields``), the config checked as
    #: SkyRL's loader checks it and read as its Megatron worker reads it (``config._skyrl.adapt``)
    skyrl: str | None = None
    #: what the run does with Bridge's name of a flag (an alias) that the family's provider does not declare, when
    #: known (then check-config refuses it for such a family); ``None``: not known
    foreign_alias: str | None = None
    #: the section a saved provider the run builds from is found from (NeMo-RL's ``policy``: its conversion cache;
    #: :mod:`._conversion_cache`); ``None``: the run builds a fresh provider
    conversion_cache: str | None = None
    #: the file is a provider as Bridge saved it, every field written (``run_config.yaml``): a flag and its alias
    #: that disagree are read as the build reads the provider (frozen if either is true)
    saves_every_field: bool = False

    def key(self, setting: str) -> str:
        """The dotted key of a plugin key (a flag or a pattern key) in this layout."""
        return f"{self.home(setting)}.{setting}"

    def home(self, setting: str) -> str:
        """The section a plugin key (a flag or a pattern key) goes in."""
        return self.flag_homes.get(setting, self.flags)

    def alias_home(self, alias: str) -> str:
        """The section Bridge's name of a flag (``freeze_sound_encoder``) goes in: its own, else its flag's."""
        return self.alias_homes.get(alias, self.home(ALIASES[alias]))

    @property
    def plugin_homes(self) -> tuple[str, ...]:
        """Every section this layout reads plugin keys (flags, patterns) from, the flags' section first."""
        return tuple(dict.fromkeys([self.flags, *self.flag_homes.values()]))

    @property
    def lr_section(self) -> str:
        """Where this layout's runs read per-part learning rates from."""
        return self.learning_rates or self.flags

    @property
    def other_freeze_keys(self) -> frozenset[str] | None:
        """The ``freeze_*`` settings of the flags' section that are not the plugin's (``None``: any key)."""
        return self.own_keys(self.flags)

    def own_keys(self, section: str) -> frozenset[str] | None:
        """The ``freeze_*`` settings of ``section`` that are not the plugin's; ``None`` when every key there is."""
        keys: set[str] = set()
        for pattern, settings in self.own.items():
            if fnmatch.fnmatchcase(section, pattern):
                if isinstance(settings, OwnSetting):
                    return None
                keys.update(settings)
        return frozenset(keys)

    def own_setting(self, section: str, key: str) -> OwnSetting | None:
        """The setting ``section.key`` is when it is a ``freeze_*`` setting that is not the plugin's."""
        for pattern, settings in self.own.items():
            if fnmatch.fnmatchcase(section, pattern):
                found = settings if isinstance(settings, OwnSetting) else settings.get(key)
                if found is not None:
                    return found
        return None

    def refused_here(self, section: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for pattern, keys in self.refused.items():
            if fnmatch.fnmatchcase(section, pattern):
                out.update(keys)
        return out

    def reference_of(self, section: str) -> str | None:
        """What never-training component ``section`` belongs to (``None``: none)."""
        for prefix, what in self.reference_sections:
            if section == prefix or section.startswith(prefix + "."):
                return what
        return None

    def strategy_key_fix(self, key: str | None) -> str:
        """What to write to choose the Megatron strategy."""
        return self.strategy_fix or f"{key}=megatron"


# ---- what Bridge and the trainers freeze themselves (read and said, never applied by the plugin) ----------------

#: The trainers' MoE router freeze: a pre-wrap hook that freezes ``mlp.router.weight`` of every MoE layer of the
#: language model (the build accepts it next to the flags and reports it per part, with the hook).
_ROUTER = "the MoE routers (a pre-wrap hook freezes mlp.router.weight of every MoE layer of the language model)"


def _router(by: str) -> OwnSetting:
    return OwnSetting(_ROUTER, by, narrows=Part.LANGUAGE_MODEL)


#: Bridge 0.6.2's own ``freeze_*`` provider fields that are neither a flag nor a flag's alias (read from its provider
#: classes; the aliases, e.g. ``freeze_sound_encoder``, are read as their flag: :data:`~bridge_freeze_plugin.request.
#: ALIASES`): Bridge applies them when it builds the model; they freeze modules outside every part.
BRIDGE_FIELDS: Mapping[str, OwnSetting] = {
    "freeze_mtp_model": OwnSetting("the multi-token-prediction layers (EXAONE 4.5 provider)", "Bridge", outside=True),
    "freeze_modality_encoders": OwnSetting("the modality encoders (MIMO provider)", "Bridge", outside=True),
    "freeze_modality_projections": OwnSetting("the modality projections (MIMO provider)", "Bridge", outside=True),
}


def _bridge_field_elsewhere(trainer: str) -> dict[str, str]:
    """Bridge's own provider fields written in a trainer's section: refused with what they are (never "a
    misspelling of freeze_vision_model", whose advice would freeze the wrong part)."""
    return {key: (f"is Bridge's own provider field ({setting.what}), not a setting the plugin knows {trainer} to "
                  "pass from {section} to the model provider, so the run may ignore it. It is set on the provider "
                  f"in a Megatron-Bridge config (model.{key})") for key, setting in BRIDGE_FIELDS.items()}


@contextlib.contextmanager
def resolvers(layout: Layout) -> Iterator[None]:
    """The OmegaConf resolvers the layout's trainer registers (NeMo-RL's ``mul``...), while reading only: those
    this process has not registered itself are removed again afterwards."""
    added = []
    try:
        # OmegaConf 2.4 deprecates register_new_resolver for register_resolver (same behaviour for these)
        register = getattr(OmegaConf, "register_resolver", None) or OmegaConf.register_new_resolver
        for name, function in layout.resolvers.items():
            if not OmegaConf.has_resolver(name):
                register(name, function)
                added.append(name)
        yield
    finally:
        for name in added:
            OmegaConf.clear_resolver(name)
