"""The records a :class:`~bridge_freeze_plugin.config._layouts.Layout` is made of, one per job: where the plugin's
keys live (:class:`Homes`), the model's keys (:class:`ModelKeys`), LoRA's (:class:`LoraKeys`), the strategy's and
recompute's (:class:`StrategyKeys`), the per-part learning rates' (:class:`RateKeys`) and what the trainer does
with a config (:class:`TrainerFacts`). Each reader of a layout takes the record of its job.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

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
class Homes:
    """Where the plugin's keys (flags, patterns, Bridge's names of a flag) live, and the other ``freeze_*`` keys
    of those sections: what :mod:`._flags` and :mod:`._misplaced` read."""

    #: the section holding the flags and patterns (and other model settings)
    flags: str
    #: a plugin key (flag or pattern key) -> the section it goes in, when not :attr:`flags`
    flag_homes: Mapping[str, str] = field(default_factory=dict)
    #: Bridge's name of a flag (an alias, ``freeze_sound_encoder``) -> the section it goes in, when not the flag's
    alias_homes: Mapping[str, str] = field(default_factory=dict)
    #: a section the plugin's keys may go in -> why a plugin key homed elsewhere is not applied there
    section_notes: Mapping[str, str] = field(default_factory=dict)
    #: the reference model's flags' section (``None``: no reference model)
    reference_flags: str | None = None
    #: ((section, what), ...): components that never train; a plugin key anywhere below them is refused
    reference_sections: tuple[tuple[str, str], ...] = ()
    #: section (fnmatch pattern over the dotted path) -> its ``freeze_*`` settings that are not the plugin's (one
    #: :class:`OwnSetting` alone: every ``freeze_*`` key of the section is one)
    own: Mapping[str, Mapping[str, OwnSetting] | OwnSetting] = field(default_factory=dict)
    #: section -> ``freeze_*`` names that are no setting there, with why and what to write instead
    refused: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: what the run does with Bridge's name of a flag (an alias) that the family's provider does not declare, when
    #: known (then check-config refuses it for such a family); ``None``: not known
    foreign_alias: str | None = None
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


@dataclass(frozen=True)
class ModelKeys:
    """The model's own keys: where its family is found, and its ``language_model_only`` and its peers'."""

    #: dotted keys; ``None`` where the layout has no such setting
    path: str | None = None
    #: key holding the provider's class path (Bridge's ``_target_``), the family's source there
    provider_target: str | None = None
    #: the model path may be a hub id: map its name to a family, said to be a guess
    family_from_name: bool = False
    language_model_only: str | None = None
    peers: tuple[Peer, ...] = ()


@dataclass(frozen=True)
class LoraKeys:
    """Where the LoRA section is and how it reads (:mod:`._setting_readers`)."""

    #: the LoRA section, and its rank's key in it
    section: str
    rank: str
    #: the key of the section that turns it on (NeMo-RL's ``peft.enabled``); ``None``: present is on
    switch: str | None = None
    #: the rank a present LoRA section has when it writes none (Bridge's ``LoRA.dim``)
    default_rank: int = 0
    #: ``_target_`` values of the LoRA section that are Bridge's ``VLMLoRA`` (its own freeze switches)
    vlm_targets: tuple[str, ...] = ()
    #: a ``target_modules`` value the trainer's worker replaces by Megatron leaf names before Bridge's LoRA sees it
    #: (SkyRL's ``"all-linear"``), and the value it has when the config writes none (``None``: Bridge's default)
    target_aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    default_target: str | None = None
    #: the key naming the LoRA class (SkyRL's ``lora_type``: ``"canonical_lora"`` is Bridge's ``CanonicalLoRA``)
    type: str | None = None

    def enable(self) -> str:
        """How LoRA is turned on, in words (for messages)."""
        if self.switch is not None:
            return f"{self.section}.{self.switch}=true with {self.section}.{self.rank} > 0"
        return f"{self.section}.{self.rank} > 0"


@dataclass(frozen=True)
class StrategyKeys:
    """The strategy (backend) and recompute keys (:mod:`._setting_readers`)."""

    #: the strategy's key (``None``: none; then :attr:`fixed` or :attr:`switches`)
    key: str | None = None
    #: ((key, strategy), ...): the strategy is the one whose key is true (NeMo-RL's ``enabled`` switches)
    switches: tuple[tuple[str, str], ...] = ()
    #: what to write for the Megatron strategy (default: ``<strategy key>=megatron``)
    fix: str | None = None
    #: a strategy -> why the flags cannot apply under it (said in the refusal)
    notes: Mapping[str, str] = field(default_factory=dict)
    #: what a strategy means when the layout has no strategy key
    fixed: str | None = None
    #: the recompute keys, and a recompute key -> the switch that must be true for it to apply (NeMo-RL's
    #: ``activation_checkpointing``)
    recompute: tuple[str, ...] = ()
    recompute_switches: Mapping[str, str] = field(default_factory=dict)
    #: a recompute switch the config does not write is on (SkyRL's ``trainer.gradient_checkpointing`` defaults to
    #: true; NeMo-RL's ``activation_checkpointing`` to false)
    recompute_switches_on_by_default: bool = False
    #: the ``recompute_granularity`` keys set on the model provider as written, next to their ``recompute_method`` /
    #: ``recompute_num_layers`` (megatron-core's TransformerConfig checks the three together when it is finalized)
    provider_recompute: tuple[str, ...] = ()

    def key_fix(self) -> str:
        """What to write to choose the Megatron strategy."""
        return self.fix or f"{self.key}=megatron"


@dataclass(frozen=True)
class RateKeys:
    """Where the per-part learning rates are read, and when they are refused."""

    #: the section holding the per-part learning rates (``lr_<part>``...); ``None``: the flags' section
    section: str | None = None
    #: ``_target_`` values the learning-rate section must name to be applied (empty: no ``_target_`` needed)
    targets: tuple[str, ...] = ()
    #: why no per-part learning rate can apply in this layout's runs (``None``: they can)
    refused: str | None = None


@dataclass(frozen=True)
class TrainerFacts:
    """What the trainer does with a config: how it reads it (defaults, resolvers, overrides, SkyRL's loader), the
    provider it builds from, and its weight sync."""

    #: the value a key takes when the config does not write it (the trainer's own defaults)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    #: the trainer resolves every interpolation of the config at start (one that fails stops the run)
    resolves_whole_config: bool = False
    #: OmegaConf resolvers the trainer registers (name -> function), used while reading
    resolvers: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    #: ``key=value`` must name a key the config has (Hydra's struct mode: ``+key=value`` adds)
    strict_overrides: bool = False
    #: SkyRL's layout: its root class in SkyRL's field listing (``config._skyrl_fields``), the config checked as
    #: SkyRL's loader checks it and read as its Megatron worker reads it (``config._skyrl.adapt``)
    skyrl: str | None = None
    #: a flag the config does not write keeps the model provider's own default (NeMo-RL passes only what is
    #: written); otherwise it is false (the trainer writes every flag)
    unwritten_flags_keep_provider_default: bool = False
    #: the section a saved provider the run builds from is found from (NeMo-RL's ``policy``: its conversion cache;
    #: :mod:`._conversion_cache`); ``None``: the run builds a fresh provider
    conversion_cache: str | None = None
    #: the run syncs the policy's weights to an inference engine (RL rollouts): always, or when one of
    #: ``syncs_weights_with`` (top-level sections) is present
    syncs_weights: bool = False
    syncs_weights_with: tuple[str, ...] = ()
    #: why LoRA with full-rank parts is refused for this trainer's weight sync (``None``: the rule's own words)
    weight_sync_note: str | None = None
