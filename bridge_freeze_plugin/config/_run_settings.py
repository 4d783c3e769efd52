"""The record of what the rules read from one run's config (:class:`RunSettings`), with its LoRA settings and
the ``freeze_*`` settings that are Bridge's or the trainer's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge_freeze_plugin.config._layouts import OwnSetting
from bridge_freeze_plugin.config._values import IN_CONFIG, Setting
from bridge_freeze_plugin.errors import InvalidFreezeConfigError
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.request import FreezeSelection, Part


@dataclass(frozen=True)
class LoraSettings:
    """The LoRA settings that matter to the freeze rules. ``rank`` 0 means LoRA is off."""

    rank: int = 0
    alpha: float | None = None
    #: ``None``: not written (Bridge's LoRA default, four leaf names); ``()``: written empty (Bridge's LoRA then
    #: matches every linear module, less ``exclude_modules``)
    target_modules: tuple[str, ...] | str | None = None
    exclude_modules: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise InvalidFreezeConfigError(f"LoRA rank must be a non-negative integer (0: LoRA off), got {self.rank!r}")
        if isinstance(self.target_modules, list):
            object.__setattr__(self, "target_modules", tuple(self.target_modules))
        object.__setattr__(self, "exclude_modules", tuple(self.exclude_modules or ()))

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass(frozen=True)
class OwnFreeze:
    """A ``freeze_*`` setting that is Bridge's or the trainer's own (not the plugin's), as the config writes it."""

    key: str
    value: Any
    setting: OwnSetting
    source: str = IN_CONFIG

    @property
    def name(self) -> str:
        return self.key.rpartition(".")[2]


@dataclass(frozen=True)
class SelectionSources:
    """Where the selection was read: the plugin keys' dotted keys, the reference model's, the ``freeze_*`` keys
    that are not the plugin's, and the flags' values that come from elsewhere (read by :mod:`._rules`,
    :mod:`._checks` and check-config's tables)."""

    flags_key: str
    #: plugin key (a flag or a pattern key) -> its dotted key, where it is not ``<flags_key>.<name>``
    flag_keys: Mapping[str, str] = field(default_factory=dict)
    #: flag -> the dotted keys of Bridge's names of it (aliases: ``freeze_sound_encoder``) in this layout
    alias_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: dotted keys of Bridge's names of a flag (aliases) the config writes, and what the run does with one the
    #: family's provider lacks (``None``: not known, not checked)
    aliases_written: tuple[str, ...] = ()
    foreign_alias: str | None = None
    reference: FreezeSelection | None = None
    reference_key: str | None = None
    #: ``freeze_*`` settings that are Bridge's or the trainer's own: read and said, applied by them
    own_freeze: tuple[OwnFreeze, ...] = ()
    #: ``freeze_*`` keys the layout reads nowhere (``key=value``): reported
    unread_freeze_keys: tuple[str, ...] = ()
    #: malformed settings next to the flags (rejected only when a flag is set)
    malformed: tuple[str, ...] = ()
    #: flags the config does not write that keep the model provider's own default (flag -> where it comes from)
    provider_defaults: Mapping[str, str] = field(default_factory=dict)
    #: the saved provider the run builds from (NeMo-RL's conversion cache), in words; ``None``: none
    saved_provider: str | None = None

    def key_of(self, name: str) -> str:
        """The dotted key of a plugin key (a flag or a pattern key) in this run's config."""
        return self.flag_keys.get(name, f"{self.flags_key}.{name}")

    def keys_of(self, flag: str) -> tuple[str, ...]:
        """Every key a flag may be written under in this run's config: its own, then Bridge's names of it."""
        return (self.key_of(flag), *self.alias_keys.get(flag, ()))


@dataclass(frozen=True)
class RunSwitches:
    """The run's switches the freeze rules weigh: the strategy (and its words), ``language_model_only`` and its
    peers', recompute, the weight sync."""

    strategy: Setting
    language_model_only: Setting
    recompute: tuple[Setting, ...]
    #: other components' language_model_only that must agree with the policy's (used ones only)
    peers: tuple[tuple[str, Setting], ...] = ()
    #: what to write to choose the Megatron strategy, and why the flags cannot apply under the strategy read
    strategy_fix: str | None = None
    strategy_note: str | None = None
    #: why no strategy is read, in words (``None``: the strategy key is not set)
    strategy_unset: str | None = None
    #: the strategy as written, when it is chosen by switches (``None``: ``strategy.written``)
    strategy_shown: str | None = None
    #: the run syncs the policy's weights to an inference engine (RL rollouts): LoRA with full-rank parts refused
    syncs_weights: bool = False
    #: why that refusal holds for this trainer (``None``: the rule's own words)
    weight_sync_note: str | None = None
    #: the provider's ``full_recompute_policy`` (and its former name) as written; none: "fix"
    recompute_policy: tuple[Setting, ...] = ()
    #: (granularity, method, num_layers) of each section set on the provider as written (``None``: not known)
    provider_recompute: tuple[tuple[Setting, Setting | None, Setting | None], ...] = ()


@dataclass(frozen=True)
class LoraRead:
    """How the config writes LoRA, beside :class:`LoraSettings` (what it is): the rank's setting, how LoRA is
    turned on (for messages), the LoRA class named, Bridge's ``VLMLoRA`` switches."""

    rank: Setting
    enable: str | None = None
    #: the LoRA class (its ``_target_``) when the config names one
    lora_class: str | None = None
    #: Bridge's ``VLMLoRA``: its own three switches (``peft.freeze_*``, flag name -> setting)
    vlm_lora: Mapping[str, Setting] | None = None


@dataclass(frozen=True)
class RateSettings:
    """The per-part learning rates (``lr_<part>`` / ``min_lr_<part>``; ``None``: the global schedule) and the
    section they were read from (next to the flags; Bridge: its optimizer override provider)."""

    values: Any = None
    key: str | None = None


@dataclass(frozen=True)
class RunSettings:
    """What the rules read from one run's config, grouped by job: the selection and where it was read
    (:attr:`sources`), the run's switches (:attr:`run`), LoRA (:attr:`lora`, :attr:`lora_read`), the per-part
    learning rates (:attr:`rates`), the model (family, provider)."""

    layout: str
    selection: FreezeSelection
    sources: SelectionSources
    run: RunSwitches
    lora: LoraSettings
    lora_read: LoraRead
    rates: RateSettings = field(default_factory=RateSettings)
    family: FamilySpec | None = None
    family_source: str | None = None
    provider: Any = None
    provider_target: Setting | None = None
    #: who runs the config ("the trainer", "Megatron-Bridge", "NeMo-RL")
    trainer: str = "the trainer"

    @property
    def parts(self) -> tuple[Part, ...]:
        """The model's parts: its family's; family unknown: those assumed for a VLM, and any part flagged."""
        return self.selection.parts_of(None if self.family is None else self.family.part_names())

    def key_of(self, name: str) -> str:
        """The dotted key of a plugin key (a flag or a pattern key) in this run's config."""
        return self.sources.key_of(name)

    def keys_of(self, flag: str) -> tuple[str, ...]:
        """Every key a flag may be written under in this run's config: its own, then Bridge's names of it."""
        return self.sources.keys_of(flag)
