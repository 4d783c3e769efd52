"""A layout + a config -> :class:`RunSettings`: every value the rules read, and where it came from.

Reading judges only the shape of a value (a flag that is not a real boolean, a key that looks like a
misspelt flag: errors at once); what the values mean together is for :mod:`bridge_freeze_plugin.rules`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bridge_freeze_plugin.config.layouts import Layout, plugin_sections
from bridge_freeze_plugin.config.loading import brief
from bridge_freeze_plugin.errors import (
    FreezeFlagTypeError,
    InvalidFreezeConfigError,
    InvalidPatternError,
    PartLearningRateError,
)
from bridge_freeze_plugin.optim.settings import LR_KEYS, looks_like_lr_key, read_part_learning_rates
from bridge_freeze_plugin.registry import FamilySpec
from bridge_freeze_plugin.selection import FLAGS, PATTERN_KEYS, FreezeSelection

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
    target_modules: tuple[str, ...] | str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise InvalidFreezeConfigError(f"LoRA rank must be a non-negative integer (0: LoRA off), got {self.rank!r}")
        if isinstance(self.target_modules, list):
            object.__setattr__(self, "target_modules", tuple(self.target_modules))

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


def _flag_problem(where: str, key: str, value: Any, known: frozenset[str] | None) -> tuple[str, bool] | None:
    """(message, is-a-type-problem) for one key of a flags' section, or ``None`` when it is fine."""
    if key in FLAGS:
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
    close = difflib.get_close_matches(key.lower(), FLAGS, n=1, cutoff=_MISSPELLING_CUTOFF)
    if close:
        return (f"{where}.{key} is not a freeze flag; did you mean {where}.{close[0]}? "
                f"(the flags are {', '.join(FLAGS)})", False)
    if known is not None and key.startswith("freeze_") and key not in known:
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
    section = {} if section is None else plain(section, where)
    if not isinstance(section, Mapping):
        raise InvalidFreezeConfigError(f"{where} must be a mapping of settings, got {section!r}")
    problems = [p for k, v in section.items() if (p := _flag_problem(where, str(k), v, known)) is not None]
    if problems:
        type_only = all(is_type for _, is_type in problems)
        raise (FreezeFlagTypeError if type_only else InvalidFreezeConfigError)(join_problems([m for m, _ in problems]))
    patterns = {k: [v] if isinstance(v, str) else list(v) for k, v in section.items() if k in PATTERN_KEYS}
    try:  # an invalid pattern fails here, naming the key, before any build
        return FreezeSelection(**{str(k): v for k, v in section.items() if k in FLAGS}, **patterns)
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
    settings = LoraSettings(rank=rank, alpha=lora.get("alpha"),
                            target_modules=tuple(target) if isinstance(target, list) else target)
    return settings, Setting(rank, key, source(key))


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


def misplaced_keys(cfg: Any, layout: Layout) -> list[str]:
    """Flags, patterns and learning rates written where ``layout``'s runs never read them (they would be dropped).

    The whole config is walked (keys only, nothing resolved). In a section some layout reads the plugin's keys
    from, any key shaped like one counts (a near-misspelt flag, ``lr_vision``...); anywhere else, the exact names
    (``trainer.critic.megatron_config.freeze_vision_model``, ``optimizer.lr_vision_model``). Only the chosen
    layout's own sections are read; a flag under its reference model is left to the reference rule.
    """
    sections = set(plugin_sections())
    keys, referenced = _all_keys(cfg)
    problems = []
    for where, key in keys:
        if any(where == ref or where.startswith(ref + ".") for ref in referenced):
            continue  # read through an interpolation (megatron_config: ${base}): judged where it is used
        kind = _plugin_key(key) if where in sections else _exact_plugin_key(key)
        if kind == "flag" and where not in (layout.flags, layout.reference_flags):
            problems.append(
                f"{_dotted(where, key)} is not read in the {layout.title} layout, so the run would ignore it: the "
                f"flags and patterns go under {layout.flags}. Write {layout.flags}.{key} instead"
            )
        elif kind == "lr" and where == layout.reference_flags:
            problems.append(
                f"{_dotted(where, key)}: the reference model never trains, so a learning rate there never applies. "
                f"Remove it; per-part learning rates of the policy go under {layout.lr_section}"
            )
        elif kind == "lr" and where != layout.lr_section:
            problems.append(f"{_dotted(where, key)} is not read in the {layout.title} layout, so the run would "
                            f"ignore it{_lr_home(layout, where, key)}")
    return problems


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


def read_settings(cfg: Any, layout: Layout, source: Source | None = None) -> RunSettings:
    """Every value the rules read from ``cfg`` in ``layout``; ``source(key)`` says where a key's value came from.

    Raises at once for a flag that is not a boolean or an unknown freeze key (policy or reference model), and
    for a flag, pattern or learning rate written where this layout's runs never read it; a malformed
    neighbouring setting is kept in :attr:`RunSettings.malformed`.
    """
    source = source or (lambda key: IN_CONFIG)
    if not isinstance(cfg, (DictConfig, Mapping)):
        raise TypeError(f"expected an OmegaConf DictConfig or a mapping, got {type(cfg).__name__}")
    misplaced = misplaced_keys(cfg, layout)
    if misplaced:
        raise InvalidFreezeConfigError(join_problems(misplaced))
    flags = section(cfg, layout.flags)
    selection = read_selection(flags, where=layout.flags, known=layout.other_freeze_keys)
    reference = None
    if layout.reference_flags is not None:
        reference = read_selection(section(cfg, layout.reference_flags), where=layout.reference_flags,
                                   known=layout.other_freeze_keys)
    malformed: list[str] = []
    strategy = select(cfg, layout.strategy) if layout.strategy else layout.fixed_strategy
    lmo = _bool_setting(cfg, layout.language_model_only, source, malformed)
    lora, rank = _lora(cfg, layout, source, malformed)
    target = select(cfg, layout.provider_target) if layout.provider_target else None
    # Per-part learning rates (lr_<part>, min_lr_<part>): next to the flags, or (Bridge) on the optimizer
    # override provider; checked as they are read.
    learning_rates = read_part_learning_rates(_learning_rate_section(cfg, layout, flags), where=layout.lr_section,
                                              frozen=selection.untrained_parts(), lora=lora.enabled,
                                              flags_where=layout.flags)
    return RunSettings(
        layout=layout.name,
        selection=selection,
        flags_key=layout.flags,
        strategy=Setting(None if strategy is None else str(strategy), layout.strategy,
                         source(layout.strategy) if layout.strategy else f"always, in the {layout.title} layout"),
        language_model_only=lmo,
        lora=lora,
        lora_rank=rank,
        recompute=tuple(Setting(select(cfg, key), key, source(key)) for key in layout.recompute),
        provider_target=None if target is None else Setting(str(target), layout.provider_target,
                                                             source(str(layout.provider_target))),
        reference=reference,
        reference_key=layout.reference_flags,
        peers=_peers(cfg, layout, source),
        malformed=tuple(malformed),
        learning_rates=learning_rates,
        learning_rates_key=layout.lr_section,
    )
