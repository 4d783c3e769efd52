"""A layout + a config -> :class:`RunSettings`: every value the rules read, and where it came from.

Reading judges only the shape of a value (a flag that is not a real boolean, a key that looks like a
misspelt flag: errors at once); what the values mean together is for :mod:`bridge_freeze_plugin.config._rules`.
"""

from __future__ import annotations

import contextlib
import difflib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bridge_freeze_plugin.config._layout_bridge import VLM_LORA_SWITCHES
from bridge_freeze_plugin.config._layout_detect import PLUGIN_KEYS, plugin_sections
from bridge_freeze_plugin.config._layouts import Layout, OwnSetting
from bridge_freeze_plugin.config._yaml_overrides import brief
from bridge_freeze_plugin.errors import (
    FreezeFlagTypeError,
    InvalidFreezeConfigError,
    InvalidPatternError,
    PartLearningRateError,
)
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.optim import LR_KEYS, looks_like_lr_key, read_part_learning_rates
from bridge_freeze_plugin.request import ALIASES, FLAGS, PATTERN_KEYS, FreezeSelection, Part

#: How close (difflib ratio, lower-cased) a key must be to a flag to be reported as a misspelling.
_MISSPELLING_CUTOFF = 0.8
#: Where a value came from when nothing recorded it (a config passed in code).
IN_CONFIG = "config"


def as_yaml(value: Any) -> str:
    """A value as a user would write it in YAML / on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def join_problems(problems: Sequence[str]) -> str:
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} problems in the freeze configuration:\n" + "\n".join(f"  - {p}" for p in problems)


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
class Setting:
    """One value, the key it lives at (``None``: no key, e.g. an API argument) and where it came from."""

    value: Any
    key: str | None
    source: str = IN_CONFIG

    @property
    def written(self) -> str:
        """``key=value`` (with its source when that is not the config itself)."""
        text = f"{self.key}={as_yaml(self.value)}" if self.key else as_yaml(self.value)
        return text if self.source == IN_CONFIG else f"{text} ({self.source})"


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
class RunSettings:
    """What the rules read from one run's config."""

    layout: str
    selection: FreezeSelection
    flags_key: str
    strategy: Setting
    language_model_only: Setting
    lora: LoraSettings
    lora_rank: Setting
    recompute: tuple[Setting, ...]
    family: FamilySpec | None = None
    family_source: str | None = None
    provider: Any = None
    provider_target: Setting | None = None
    reference: FreezeSelection | None = None
    reference_key: str | None = None
    #: other components' language_model_only that must agree with the policy's (used ones only)
    peers: tuple[tuple[str, Setting], ...] = ()
    #: malformed settings next to the flags (rejected only when a flag is set)
    malformed: tuple[str, ...] = field(default_factory=tuple)
    #: per-part learning rates (``lr_<part>`` / ``min_lr_<part>``; empty: the global schedule)
    learning_rates: Any = None
    #: the section the learning rates were read from (next to the flags; Bridge: its optimizer override provider)
    learning_rates_key: str | None = None
    #: plugin key (a flag or a pattern key) -> its dotted key, where it is not ``<flags_key>.<name>``
    flag_keys: Mapping[str, str] = field(default_factory=dict)
    #: ``freeze_*`` settings that are Bridge's or the trainer's own: read and said, applied by them
    own_freeze: tuple[OwnFreeze, ...] = ()
    #: ``freeze_*`` keys the layout reads nowhere (``key=value``): reported
    unread_freeze_keys: tuple[str, ...] = ()
    #: the run syncs the policy's weights to an inference engine (RL rollouts): LoRA with full-rank parts refused
    syncs_weights: bool = False
    #: why that refusal holds for this trainer (``None``: the rule's own words)
    weight_sync_note: str | None = None
    #: what to write to choose the Megatron strategy, and why the flags cannot apply under the strategy read
    strategy_fix: str | None = None
    strategy_note: str | None = None
    #: why no strategy is read, in words (``None``: the strategy key is not set)
    strategy_unset: str | None = None
    #: the strategy as written, when it is chosen by switches (``None``: ``strategy.written``)
    strategy_shown: str | None = None
    #: how LoRA is turned on here (for messages); the LoRA class (its ``_target_``) when the config names one
    lora_enable: str | None = None
    lora_class: str | None = None
    #: Bridge's ``VLMLoRA``: its own three switches (``peft.freeze_*``, flag name -> setting)
    vlm_lora: Mapping[str, Setting] | None = None
    #: flags the config does not write that keep the model provider's own default (flag -> where it comes from)
    provider_defaults: Mapping[str, str] = field(default_factory=dict)
    #: who runs the config ("the trainer", "Megatron-Bridge", "NeMo-RL")
    trainer: str = "the trainer"
    #: dotted keys of Bridge's names of a flag (aliases) the config writes, and what the run does with one the
    #: family's provider lacks (``None``: not known, not checked)
    aliases_written: tuple[str, ...] = ()
    foreign_alias: str | None = None
    #: the saved provider the run builds from (NeMo-RL's conversion cache), in words; ``None``: none
    saved_provider: str | None = None
    #: flag -> the dotted keys of Bridge's names of it (aliases: ``freeze_sound_encoder``) in this layout
    alias_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def parts(self) -> tuple[Part, ...]:
        """The model's parts: its family's; family unknown: those assumed for a VLM, and any part flagged."""
        return self.selection.parts_of(None if self.family is None else self.family.part_names())

    def key_of(self, name: str) -> str:
        """The dotted key of a plugin key (a flag or a pattern key) in this run's config."""
        return self.flag_keys.get(name, f"{self.flags_key}.{name}")

    def keys_of(self, flag: str) -> tuple[str, ...]:
        """Every key a flag may be written under in this run's config: its own, then Bridge's names of it."""
        return (self.key_of(flag), *self.alias_keys.get(flag, ()))


def plain(node: Any, key: str) -> Any:
    """A config node as plain Python (interpolations resolved); mappings stay mappings."""
    if isinstance(node, DictConfig) or OmegaConf.is_config(node):
        try:
            return OmegaConf.to_container(node, resolve=True)
        except OmegaConfBaseException as exc:
            raise InvalidFreezeConfigError(f"cannot resolve {key}: {brief(exc)}") from exc
        except RecursionError:
            raise InvalidFreezeConfigError(f"cannot resolve {key}: it nests, or refers to itself, too deep") from None
    return node


def select(cfg: Any, key: str) -> Any:
    """``cfg[key]`` for a dotted key, ``None`` when any level is missing (or null).

    A level above the key that holds something other than a mapping (``megatron_config: 5``, a list) is an
    error naming it: the key cannot be there, and reading it as unset would drop what the user wrote.
    """
    node: Any = cfg
    done: list[str] = []
    for part in key.split("."):
        if isinstance(node, DictConfig):
            if part not in node:
                return None
            try:
                node = node[part]
            except OmegaConfBaseException as exc:
                raise InvalidFreezeConfigError(f"cannot resolve {key}: {brief(exc)}") from exc
            except RecursionError:
                raise InvalidFreezeConfigError(f"cannot resolve {key}: it refers to itself") from None
        elif isinstance(node, Mapping):
            node = node.get(part)
        else:
            where = ".".join(done)
            raise InvalidFreezeConfigError(
                f"{where} must be a mapping of settings (it holds {key}), got {brief(repr(plain(node, where)))} "
                f"({type_label(plain(node, where))}); write it as {where}: {{...}}"
            )
        done.append(part)
        if node is None:
            return None
    return plain(node, key)


def type_label(value: Any) -> str:
    return "a list" if isinstance(value, list | tuple) else type(value).__name__


def section(cfg: Any, key: str) -> Mapping[str, Any]:
    value = select(cfg, key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidFreezeConfigError(
            f"{key} must be a mapping of settings, got {brief(repr(value))} ({type_label(value)}); write it as "
            f"{key}: {{...}}"
        )
    return value


def _flag_problem(where: str, key: str, value: Any, known: frozenset[str] | None,
                  refused: Mapping[str, str] | None = None, any_own: bool = False) -> tuple[str, bool] | None:
    """(message, is-a-type-problem) for one key of a flags' section, or ``None`` when it is fine.

    ``known``: the section's ``freeze_*`` settings that are not the plugin's (``None``: not checked: only
    misspellings of the flags are refused); they are checked before misspellings, so Bridge's
    ``freeze_audio_model`` is never "a misspelling of freeze_vision_model". ``any_own``: every ``freeze_*`` key
    of the section is such a setting. ``refused``: names that are no setting there, with why.
    """
    if refused and key in refused:  # first: an alias may be no setting in a section (NeMo-RL's model_overrides)
        return (f"{where}.{key} {refused[key].format(section=where, key=key)}", False)
    if key in FLAGS or key in ALIASES:
        if isinstance(value, bool):
            return None
        return (
            f"{where}.{key} must be a boolean (true or false), got {as_yaml(value)!r} "
            f"({type(value).__name__}); write {where}.{key}=true or {where}.{key}=false", True,
        )
    if key in LR_KEYS or looks_like_lr_key(key):
        return None  # per-part learning rates: read and checked by optim.settings.read_part_learning_rates
    if key in PATTERN_KEYS:
        items = [value] if isinstance(value, str) else value
        if isinstance(items, (list, tuple)) and all(isinstance(i, str) for i in items):
            return None
        return (f"{where}.{key} must be a list of patterns (strings), got {as_yaml(value)!r}", False)
    if (any_own and key.startswith("freeze_")) or (known is not None and key in known):
        return None  # Bridge's or the trainer's own setting (read and said, never the plugin's)
    close = difflib.get_close_matches(key.lower(), FLAGS, n=1, cutoff=_MISSPELLING_CUTOFF)
    if close:
        return (f"{where}.{key} is not a freeze flag; did you mean {where}.{close[0]}? "
                f"(the flags are {', '.join(FLAGS)})", False)
    if known is not None and key.startswith("freeze_"):
        guess = difflib.get_close_matches(key.lower(), FLAGS, n=1, cutoff=0.5)
        hint = f"did you mean {where}.{guess[0]}? " if guess else ""
        others = f"; other freeze settings here: {', '.join(sorted(known))}" if known else ""
        return (f"{where}.{key} is neither a freeze flag nor a known setting of this section; {hint}"
                f"(the flags are {', '.join(FLAGS)}{others})", False)
    return None


def read_selection(
    section: Mapping[str, Any] | None, *, where: str = "megatron_config", known: frozenset[str] | None = None
) -> FreezeSelection:
    """The selection in a ``megatron_config``-like mapping, checking every value and key.

    Values must be real booleans (YAML ``true``/``false``); ``1``, ``"yes please"`` or ``null`` are
    rejected naming the key. A key that looks like a misspelt flag (``freeze_vison_model``) is
    rejected with the closest flag. With ``known`` (a layout's other ``freeze_*`` settings), any other
    ``freeze_*`` key is rejected too. Other keys are ignored. A missing flag means ``false``.
    """
    values = _checked_section(section, where, known)
    return _selection({where: values}, {key: where for key in PLUGIN_KEYS})


def _checked_section(section: Mapping[str, Any] | None, where: str, known: frozenset[str] | None,
                     refused: Mapping[str, str] | None = None, any_own: bool = False) -> Mapping[str, Any]:
    """``section`` as plain Python, every key checked (:func:`_flag_problem`); raises for the first problems."""
    section = {} if section is None else plain(section, where)
    if not isinstance(section, Mapping):
        raise InvalidFreezeConfigError(f"{where} must be a mapping of settings, got {section!r}")
    problems = [p for k, v in section.items()
                if (p := _flag_problem(where, str(k), v, known, refused, any_own)) is not None]
    if problems:
        type_only = all(is_type for _, is_type in problems)
        raise (FreezeFlagTypeError if type_only else InvalidFreezeConfigError)(join_problems([m for m, _ in problems]))
    return section


def _selection(sections: Mapping[str, Mapping[str, Any]], homes: Mapping[str, str],
               saved: bool = False) -> FreezeSelection:
    """The selection from checked sections: each plugin key read from its home section (``homes``; an alias of a
    flag from its own home when ``homes`` names one, else its flag's).

    ``saved``: the sections are a provider as Bridge saved it (``run_config.yaml``: every field written), so a flag
    and its alias that disagree are read as the build reads such a provider: the part is frozen if either is true
    (a build before the plugin wrote the merged value back saved the alias true and the flag false)."""
    flags = {key: sections[homes[key]][key] for key in FLAGS if key in sections.get(homes[key], {})}
    for alias, flag in ALIASES.items():  # Bridge's own name of a flag (freeze_sound_encoder): read as the flag
        where = homes.get(alias, homes[flag])
        home = sections.get(where, {})
        if alias not in home:
            continue
        if flag in flags and flags[flag] != home[alias]:
            if saved:  # every field saved (Bridge's run_config.yaml): the build froze the part if either is true
                flags[flag] = True
                continue
            raise InvalidFreezeConfigError(
                f"{where}.{alias}={as_yaml(home[alias])} and {homes[flag]}.{flag}={as_yaml(flags[flag])} "
                f"disagree: {alias} is Bridge's name of {flag} (the same part). Write one of them.")
        flags[flag] = home[alias]
    patterns = {key: [value] if isinstance(value, str) else list(value) for key in PATTERN_KEYS
                if (value := sections.get(homes[key], {}).get(key)) is not None}
    where = ", ".join(dict.fromkeys(homes[key] for key in PATTERN_KEYS if patterns.get(key))) or homes[FLAGS[0]]
    try:  # an invalid pattern fails here, naming the key, before any build
        return FreezeSelection(**flags, **patterns)
    except InvalidFreezeConfigError as exc:
        raise type(exc)(f"{where}: {exc}") from None
    except (OverflowError, RecursionError) as exc:
        # Python's regex compiler raises these, not re.error, for a repetition count above 4294967295 or
        # groups nested a few hundred deep: still the user's pattern, so still a config error naming it.
        raise InvalidPatternError(
            f"{where}: a pattern in {', '.join(k for k in PATTERN_KEYS if patterns.get(k))} cannot be compiled "
            f"({type(exc).__name__}: {brief(exc)}): a repetition count above 4294967295 or groups nested hundreds "
            "deep; simplify it"
        ) from None


Source = Callable[[str], str]


def _bool_setting(cfg: Any, key: str | None, source: Source, malformed: list[str]) -> Setting:
    value = None if key is None else select(cfg, key)
    if value is not None and not isinstance(value, bool):
        malformed.append(f"{key} must be a boolean (true or false), got {as_yaml(value)!r}")
    return Setting(bool(value), key, source(key) if key else IN_CONFIG)


def _lora(cfg: Any, layout: Layout, source: Source, malformed: list[str]) -> tuple[LoraSettings, Setting]:
    key = f"{layout.lora}.{layout.lora_rank}"
    present = select(cfg, layout.lora) is not None
    lora = section(cfg, layout.lora)
    if layout.lora_switch is not None:  # NeMo-RL: peft.enabled turns it on; its dim is then required
        switch = f"{layout.lora}.{layout.lora_switch}"
        enabled = lora.get(layout.lora_switch)
        if enabled is not None and not isinstance(enabled, bool):
            malformed.append(f"{switch} must be a boolean (true or false), got {as_yaml(enabled)!r}")
        if enabled is not True:
            return LoraSettings(), Setting(0, key, f"{switch} is not true: LoRA off ({source(switch)})")
        if lora.get(layout.lora_rank) is None:
            malformed.append(f"{key} must be set when {switch}=true ({layout.trainer} refuses LoRA without it)")
            return LoraSettings(), Setting(None, key, source(key))
    rank = lora.get(layout.lora_rank, layout.lora_default_rank if present else 0)
    rank = 0 if rank is None else rank
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        malformed.append(f"{key} must be a non-negative integer (0: LoRA off), got {as_yaml(rank)!r}")
        return LoraSettings(), Setting(rank, key, source(key))
    target = lora.get("target_modules")
    if target is not None and not isinstance(target, str) and not (
            isinstance(target, list) and all(isinstance(t, str) for t in target)):
        malformed.append(f"{layout.lora}.target_modules must be a module name or a list of them, got "
                         f"{brief(repr(target))} ({type_label(target)})")
        target = None
    exclude = lora.get("exclude_modules")
    exclude = [exclude] if isinstance(exclude, str) else exclude if isinstance(exclude, list) else []
    settings = LoraSettings(rank=rank, alpha=lora.get("alpha"),
                            target_modules=tuple(target) if isinstance(target, list) else target,
                            exclude_modules=tuple(str(e) for e in exclude))
    return settings, Setting(rank, key, source(key))


def _lora_enable(layout: Layout) -> str:
    if layout.lora_switch is not None:
        return f"{layout.lora}.{layout.lora_switch}=true with {layout.lora}.{layout.lora_rank} > 0"
    return f"{layout.lora}.{layout.lora_rank} > 0"


def _vlm_lora(cfg: Any, layout: Layout, lora: LoraSettings, source: Source) -> Mapping[str, Setting] | None:
    """Bridge's ``VLMLoRA`` switches (``peft.freeze_*``, true when not written: its defaults), if that is the class."""
    if not lora.enabled or select(cfg, f"{layout.lora}._target_") not in layout.vlm_lora_targets:
        return None
    values = section(cfg, layout.lora)
    out = {}
    for flag in VLM_LORA_SWITCHES:
        key = f"{layout.lora}.{flag}"
        value = values.get(flag, True)
        if not isinstance(value, bool):
            raise FreezeFlagTypeError(f"{key} (VLMLoRA's own switch) must be a boolean (true or false), got "
                                      f"{as_yaml(value)!r}")
        out[flag] = Setting(value, key, source(key) if flag in values else "VLMLoRA's default")
    return out


def _strategy(cfg: Any, layout: Layout, source: Source) -> tuple[Setting, str | None]:
    """The strategy setting and, when the flags cannot apply under it, why (from the layout's notes)."""
    if layout.strategy_switches:  # NeMo-RL: the backend whose `enabled` switch is true
        on = [(key, name) for key, name in layout.strategy_switches if select(cfg, key) is True]
        value = "+".join(name for _, name in on) or None
        key = on[0][0] if len(on) == 1 else layout.strategy_switches[0][0]
        return Setting(value, key, source(key)), layout.strategy_notes.get(value) if value is not None else None
    strategy = select(cfg, layout.strategy) if layout.strategy else layout.fixed_strategy
    value = None if strategy is None else str(strategy)
    where = source(layout.strategy) if layout.strategy else f"always, in the {layout.title} layout"
    return Setting(value, layout.strategy, where), layout.strategy_notes.get(value) if value is not None else None


def _switches_shown(cfg: Any, layout: Layout, source: Source) -> str | None:
    """The backend switches that are on, as written (``policy.dtensor_cfg.enabled=true (sft.yaml)``)."""
    if not layout.strategy_switches:
        return None
    on = [Setting(True, key, source(key)).written + f" (the {name} backend)"
          for key, name in layout.strategy_switches if select(cfg, key) is True]
    return " and ".join(on) or None


def _recompute(cfg: Any, layout: Layout, source: Source) -> tuple[Setting, ...]:
    out = []
    for key in layout.recompute:
        value = select(cfg, key)
        switch = layout.recompute_switches.get(key)
        if switch is not None and value is not None and select(cfg, switch) is not True:
            # the trainer applies it only when the switch is on (NeMo-RL: activation_checkpointing)
            out.append(Setting(None, key, f"{as_yaml(value)} written, not applied: {switch} is not true"))
            continue
        out.append(Setting(value, key, source(key)))
    return tuple(out)


def _peers(cfg: Any, layout: Layout, source: Source) -> tuple[tuple[str, Setting], ...]:
    """The other components' language_model_only, for those the config writes and that are used."""
    out = []
    for peer in layout.peers:
        value = select(cfg, peer.key)
        used = not peer.used_when or any(select(cfg, k) is True for k in peer.used_when)
        if value is not None and used:
            out.append((peer.what, Setting(value, peer.key, source(peer.key))))
    return tuple(out)


def _plugin_key(key: str) -> str | None:
    """``"flag"`` for a freeze flag or pattern key (or a near-misspelling of a flag), ``"lr"`` for a key shaped
    like a per-part learning rate, else ``None``."""
    if looks_like_lr_key(key):
        return "lr"
    if key in FLAGS or key in PATTERN_KEYS or difflib.get_close_matches(key.lower(), FLAGS, n=1,
                                                                         cutoff=_MISSPELLING_CUTOFF):
        return "flag"
    return None


def _homes_text(layout: Layout) -> str:
    """Where the flags and patterns go, in words."""
    if not layout.flag_homes:
        return f"the flags and patterns go under {layout.flags}"
    elsewhere: dict[str, list[str]] = {}
    for key, home in layout.flag_homes.items():
        elsewhere.setdefault(home, []).append(key)
    rest = "; ".join(f"{', '.join(keys)} under {home}" for home, keys in elsewhere.items())
    here = [key for key in PLUGIN_KEYS if key not in layout.flag_homes]
    return f"{', '.join(here)} go under {layout.flags}; {rest}"


def _own_here(cfg: Any, layout: Layout, where: str, key: str) -> bool:
    """Whether ``where.key`` is Bridge's or the trainer's own ``freeze_*`` setting (never one of the plugin's)."""
    if layout.own_setting(where, key) is not None:
        return True
    return (key in FLAGS and where == layout.lora and bool(layout.vlm_lora_targets)
            and select(cfg, f"{layout.lora}._target_") in layout.vlm_lora_targets)


def _unset(value: Any) -> bool:
    return value is None or value is False or value == [] or value == ""


def misplaced_keys(cfg: Any, layout: Layout) -> list[str]:
    """Flags, patterns and learning rates written where ``layout``'s runs never read them (they would be dropped).

    The whole config is walked (keys only, nothing resolved). In a section some layout reads the plugin's keys
    from, any key shaped like one counts (a near-misspelt flag, ``lr_vision``...); anywhere else, the exact names
    (``trainer.critic.megatron_config.freeze_vision_model``, ``optimizer.lr_vision_model``). Only the chosen
    layout's own sections are read (each plugin key in its home: :meth:`Layout.home`); a flag under its
    reference model is left to the reference rule; Bridge's and the trainer's own ``freeze_*`` settings
    (``VLMLoRA``'s switches, NeMo-RL's ``freeze_config``) are theirs, not misplaced.
    """
    sections = set(plugin_sections())
    keys, referenced = _all_keys(cfg)
    problems = []
    for where, key in keys:
        if any(where == ref or where.startswith(ref + ".") for ref in referenced):
            continue  # read through an interpolation (megatron_config: ${base}): judged where it is used
        kind = _plugin_key(key) if where in sections else _exact_plugin_key(key)
        if kind is None or _own_here(cfg, layout, where, key):
            continue
        dotted = _dotted(where, key)
        never = layout.reference_of(where)
        if never is not None:
            if not _unset(_quiet(cfg, dotted)):
                problems.append(
                    f"{dotted}: {never} never trains, so a freeze flag, pattern or learning rate there has no "
                    f"meaning. Remove it (or set it false / empty if a YAML merge copied it from the policy); the "
                    f"policy's go under {layout.lr_section if kind == 'lr' else layout.flags}"
                    + (f" ({_homes_text(layout)})" if layout.flag_homes and kind == "flag" else ""))
            continue
        if kind == "flag":
            exact = key in PLUGIN_KEYS
            if where == layout.reference_flags or (exact and where == layout.home(key)) or (
                    not exact and where in layout.plugin_homes):
                continue  # read (a near-misspelling in a home section: reading names the flag it means)
            if exact and where in layout.plugin_homes:
                problems.append(f"{dotted} is not applied in a {layout.title} run: {layout.section_notes[where]}. "
                                f"Write {layout.key(key)} instead")
                continue
            home = layout.key(key) if exact else f"{layout.flags}.{key}"
            problems.append(
                f"{dotted} is not read in the {layout.title} layout, so the run would ignore it: "
                f"{_homes_text(layout)}. Write {home} instead"
            )
        elif kind == "lr" and layout.learning_rates_refused is not None:
            problems.append(f"{dotted}: {layout.learning_rates_refused}")
        elif kind == "lr" and where == layout.reference_flags:
            problems.append(
                f"{dotted}: the reference model never trains, so a learning rate there never applies. "
                f"Remove it; per-part learning rates of the policy go under {layout.lr_section}"
            )
        elif kind == "lr" and where != layout.lr_section:
            problems.append(f"{dotted} is not read in the {layout.title} layout, so the run would "
                            f"ignore it{_lr_home(layout, where, key)}")
    return problems


def _quiet(cfg: Any, key: str) -> Any:
    """``cfg[key]`` resolved, or ``True`` (something is written) when it cannot be resolved."""
    try:
        return select(cfg, key)
    except InvalidFreezeConfigError:
        return True


def unread_freeze_keys(cfg: Any, layout: Layout) -> list[str]:
    """Every ``freeze_*`` key (``key=value``) of the config that ``layout`` reads nowhere.

    Not counted: the plugin's own keys (read in their home, or refused where they are not:
    :func:`misplaced_keys`), the keys of the sections the plugin's keys are read from (checked there: an unknown
    ``freeze_*`` key is an error), Bridge's and the trainer's own settings where the layout knows them, and what
    is read through an interpolation (judged where it is used). What is left is a setting of another config
    layout, or of no trainer: a run of this layout never reads it.
    """
    keys, referenced = _all_keys(cfg)
    homes = {*layout.plugin_homes, layout.reference_flags}
    out = []
    for where, key in keys:
        if not key.lower().startswith("freeze_") or key in PLUGIN_KEYS or where in homes:
            continue
        if any(where == ref or where.startswith(ref + ".") for ref in referenced):
            continue
        if _own_here(cfg, layout, where, key):
            continue
        dotted = _dotted(where, key)
        out.append(f"{dotted}={as_yaml(_quiet_raw(cfg, dotted))}")
    return sorted(out)


def _quiet_raw(cfg: Any, key: str) -> Any:
    try:
        value = select(cfg, key)
    except InvalidFreezeConfigError:
        return "(unresolvable)"
    return value if not isinstance(value, Mapping | list) else brief(value)


def _own_freeze(cfg: Any, layout: Layout, source: Source) -> tuple[OwnFreeze, ...]:
    """Bridge's and the trainer's own ``freeze_*`` settings of the policy the config writes (not the references')."""
    keys, _ = _all_keys(cfg)
    out = []
    for where, key in keys:
        if not key.startswith("freeze_") or layout.reference_of(where) or where == layout.reference_flags:
            continue
        setting = layout.own_setting(where, key)
        if setting is None:
            continue
        dotted = _dotted(where, key)
        value = _quiet_raw(cfg, dotted)
        if isinstance(value, str) and value.startswith("{"):
            continue  # a section of such settings (NeMo-RL's freeze_config): its keys are listed
        out.append(OwnFreeze(dotted, value, setting, source(dotted)))
    return tuple(sorted(out, key=lambda o: o.key))


def _exact_plugin_key(key: str) -> str | None:
    if key in FLAGS or key in PATTERN_KEYS:
        return "flag"
    return "lr" if key in LR_KEYS else None


def _dotted(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


#: An interpolation's reference to another key (``${base}``, ``${oc.select:base.x,1}``).
_REFERENCE = re.compile(r"\$\{(?:oc\.select:)?([A-Za-z_][\w.]*)[,}]")


def _all_keys(cfg: Any) -> tuple[list[tuple[str, str]], set[str]]:
    """(parent path, key) of every mapping key in ``cfg`` (interpolations and nulls not entered), and the paths
    interpolations refer to."""
    out: list[tuple[str, str]] = []
    referenced: set[str] = set()
    stack: list[tuple[str, Any]] = [("", cfg)]
    while stack:
        path, node = stack.pop()
        if OmegaConf.is_config(node) or hasattr(node, "_is_interpolation"):
            if node._is_interpolation():
                referenced.update(_REFERENCE.findall(str(node._value())))
                continue
            if node._is_none() or node._is_missing():
                continue
        if isinstance(node, DictConfig | Mapping):
            for name in list(node.keys()):
                key = str(name)
                out.append((path, key))
                child = node._get_node(name) if isinstance(node, DictConfig) else node[name]
                stack.append((_dotted(path, key), child))
        elif isinstance(node, ListConfig | list | tuple):
            items = [node._get_node(i) for i in range(len(node))] if isinstance(node, ListConfig) else node
            stack.extend((f"{path}[{i}]", child) for i, child in enumerate(items))
    return out, referenced


def _lr_home(layout: Layout, where: str, key: str) -> str:
    if not layout.learning_rates_targets:
        return f": per-part learning rates go under {layout.lr_section}. Write {layout.lr_section}.{key} instead"
    target = layout.learning_rates_targets[0]
    provider = target.rpartition(".")[2]
    what = ("a learning rate written on the model provider is never applied" if where == layout.flags
            else "per-part learning rates are not read there")
    return (f": {what}. A Megatron-Bridge run takes per-part learning rates from its optimizer override "
            f"provider: write {layout.lr_section}: {{_target_: {target}, {key}: ...}} (in code: "
            f"cfg.{layout.lr_section} = {provider}({key}=...))")


def _learning_rate_section(cfg: Any, layout: Layout, flags: Mapping[str, Any]) -> Mapping[str, Any]:
    """The mapping the layout's runs read per-part learning rates from (an applied one only)."""
    if layout.learning_rates_refused is not None:
        return {}  # any LR key was refused while walking the config
    if layout.lr_section == layout.flags:
        return flags
    lrs = section(cfg, layout.lr_section)
    if not layout.learning_rates_targets:
        return lrs
    asked = [str(k) for k, v in lrs.items() if looks_like_lr_key(k) and v is not None]
    target = lrs.get("_target_")
    if target in layout.learning_rates_targets:
        return lrs
    if asked:
        raise PartLearningRateError(
            f"{layout.lr_section}.{asked[0]} is set, but {layout.lr_section}._target_ is {as_yaml(target)}, which "
            f"applies no per-part learning rate, so it would never apply. Set {layout.lr_section}._target_: "
            f"{layout.learning_rates_targets[0]}"
        )
    return {}


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


def _resolve_all(cfg: Any, layout: Layout) -> None:
    """The trainer resolves every interpolation at start: one that fails would stop the run, so it is an error."""
    try:
        OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else None
    except OmegaConfBaseException as exc:
        raise InvalidFreezeConfigError(
            f"an interpolation cannot be resolved, and {layout.trainer} resolves the whole config when it starts "
            f"(OmegaConf.to_container(resolve=True)), so the run would stop there: {brief(exc)}"
        ) from exc
    except RecursionError:
        raise InvalidFreezeConfigError("an interpolation refers to itself, or nests too deep, and "
                                       f"{layout.trainer} resolves the whole config when it starts") from None


def _syncs_weights(cfg: Any, layout: Layout) -> bool:
    if layout.syncs_weights:
        return True
    return any(_has(cfg, key) for key in layout.syncs_weights_with)


def _has(cfg: Any, key: str) -> bool:
    return key in cfg if isinstance(cfg, DictConfig | Mapping) else False


def read_settings(cfg: Any, layout: Layout, source: Source | None = None,
                  family: FamilySpec | None = None) -> RunSettings:
    """Every value the rules read from ``cfg`` in ``layout``; ``source(key)`` says where a key's value came from;
    ``family``: the model's, when known (a learning-rate key that names no part is answered from its parts).

    Raises at once for a flag that is not a boolean or an unknown freeze key (policy or reference model), and
    for a flag, pattern or learning rate written where this layout's runs never read it; a malformed
    neighbouring setting is kept in :attr:`RunSettings.malformed`.
    """
    source = source or (lambda key: IN_CONFIG)
    if not isinstance(cfg, (DictConfig, Mapping)):
        raise TypeError(f"expected an OmegaConf DictConfig or a mapping, got {type(cfg).__name__}")
    if layout.skyrl is not None:  # SkyRL's layout given in code: checked and read as the SkyRL here reads it
        from bridge_freeze_plugin.config._skyrl import adapt

        layout, _ = adapt(cfg, layout)
    with resolvers(layout):
        return _read(cfg, layout, source, family)


def _read(cfg: Any, layout: Layout, source: Source, family: FamilySpec | None = None) -> RunSettings:
    if layout.resolves_whole_config:
        _resolve_all(cfg, layout)
    misplaced = misplaced_keys(cfg, layout)
    if misplaced:
        raise InvalidFreezeConfigError(join_problems(misplaced))
    homes = {key: layout.home(key) for key in PLUGIN_KEYS}
    sections = {}
    for home in layout.plugin_homes:
        known = layout.own_keys(home)
        sections[home] = _checked_section(section(cfg, home), home, known or frozenset(),
                                          layout.refused_here(home), any_own=known is None)
    selection = _selection(sections, {**homes, **{a: layout.alias_home(a) for a in ALIASES}},
                           saved=layout.saves_every_field)
    reference = None
    if layout.reference_flags is not None:
        reference = read_selection(section(cfg, layout.reference_flags), where=layout.reference_flags,
                                   known=layout.own_keys(layout.reference_flags) or frozenset())
    malformed: list[str] = []
    strategy, strategy_note = _strategy(cfg, layout, source)
    lmo = _bool_setting(cfg, layout.language_model_only, source, malformed)
    lora, rank = _lora(cfg, layout, source, malformed)
    target = select(cfg, layout.provider_target) if layout.provider_target else None
    lora_class = select(cfg, f"{layout.lora}._target_") if lora.enabled else None
    # Per-part learning rates (lr_<part>, min_lr_<part>): next to the flags, or (Bridge) on the optimizer
    # override provider; checked as they are read.
    learning_rates = read_part_learning_rates(_learning_rate_section(cfg, layout, sections[layout.flags]),
                                              where=layout.lr_section, frozen=selection.untrained_parts(),
                                              lora=lora.enabled, flags_where=layout.flags,
                                              parts=None if family is None else family.part_names(),
                                              model="the model" if family is None else f"the {family.name} model")
    return RunSettings(
        layout=layout.name,
        selection=selection,
        flags_key=layout.flags,
        strategy=strategy,
        language_model_only=lmo,
        lora=lora,
        lora_rank=rank,
        recompute=_recompute(cfg, layout, source),
        provider_target=None if target is None else Setting(str(target), layout.provider_target,
                                                             source(str(layout.provider_target))),
        reference=reference,
        reference_key=layout.reference_flags,
        peers=_peers(cfg, layout, source),
        malformed=tuple(malformed),
        learning_rates=learning_rates,
        learning_rates_key=layout.lr_section,
        flag_keys={key: f"{home}.{key}" for key, home in homes.items() if home != layout.flags},
        own_freeze=_own_freeze(cfg, layout, source),
        unread_freeze_keys=tuple(unread_freeze_keys(cfg, layout)),
        syncs_weights=_syncs_weights(cfg, layout),
        weight_sync_note=layout.weight_sync_note,
        strategy_fix=layout.strategy_key_fix(layout.strategy),
        strategy_note=strategy_note,
        strategy_unset=(f"none of {' / '.join(k for k, _ in layout.strategy_switches)} is true (no backend)"
                        if layout.strategy_switches else None),
        strategy_shown=_switches_shown(cfg, layout, source),
        lora_enable=_lora_enable(layout),
        lora_class=None if lora_class is None else str(lora_class),
        vlm_lora=_vlm_lora(cfg, layout, lora, source),
        trainer=layout.trainer,
        foreign_alias=layout.foreign_alias,
        aliases_written=tuple(f"{layout.alias_home(a)}.{a}" for a in ALIASES
                              if a in sections.get(layout.alias_home(a), {})),
        alias_keys={flag: tuple(f"{layout.alias_home(a)}.{a}" for a, f in ALIASES.items() if f == flag)
                    for flag in FLAGS},
    )


def with_provider_defaults(s: RunSettings, cfg: Any, layout: Layout, family: FamilySpec | None) -> RunSettings:
    """``s`` with the flags the config does not write set as the model provider keeps them, for a layout whose
    trainer passes only the flags written (NeMo-RL): Bridge's ``Qwen3VLMoEModelProvider`` freezes the language
    model and the vision encoder by default. Said per flag in :attr:`RunSettings.provider_defaults`."""
    if not layout.unwritten_flags_keep_provider_default:
        return s
    if layout.conversion_cache is not None:  # NeMo-RL: its saved provider, found as NeMo-RL finds it
        from bridge_freeze_plugin.config._saved_provider import with_saved_provider

        return with_saved_provider(s, cfg, layout, family)
    from bridge_freeze_plugin.config._family import PROVIDER_FLAG_DEFAULTS

    known = PROVIDER_FLAG_DEFAULTS.get(family.name) if family is not None else None
    on: dict[str, bool] = {}
    notes: dict[str, str] = {}
    for flag in FLAGS:
        if any(select(cfg, key) is not None for key in s.keys_of(flag)):
            continue
        if known is not None and flag in known[1]:
            on[flag] = True
            notes[flag] = f"not written: {layout.trainer} leaves the provider's default, {known[0]}: true"
        elif family is not None:
            notes[flag] = f"not written: {layout.trainer} leaves the provider's default (false for {family.name})"
        else:
            notes[flag] = (f"not written: {layout.trainer} leaves the provider's default, false on every Bridge "
                           "provider but Qwen3VLMoEModelProvider (LM and vision encoder true): name the family to "
                           "be sure")
    if not on:
        return replace(s, provider_defaults=notes)
    selection = FreezeSelection(**{**s.selection.as_dict(), **on}, train_patterns=s.selection.train_patterns,
                                freeze_patterns=s.selection.freeze_patterns)
    return replace(s, selection=selection, provider_defaults=notes)
