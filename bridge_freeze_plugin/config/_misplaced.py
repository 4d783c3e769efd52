"""The reading's key survey, one walk of the config's keys (:func:`survey`): flags, patterns and learning rates
written where the layout's runs never read them (refused), other ``freeze_*`` keys (:func:`unread_freeze_keys`,
said), and Bridge's and the trainer's own ``freeze_*`` settings (read and said).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from bridge_freeze_plugin.config._flags import MISSPELLING_CUTOFF
from bridge_freeze_plugin.config._layout_detect import PLUGIN_KEYS, plugin_sections
from bridge_freeze_plugin.config._layouts import Layout
from bridge_freeze_plugin.config._run_settings import OwnFreeze
from bridge_freeze_plugin.config._values import Source, as_yaml, select
from bridge_freeze_plugin.config._yaml_overrides import brief
from bridge_freeze_plugin.errors import InvalidFreezeConfigError
from bridge_freeze_plugin.optim import LR_KEYS, looks_like_lr_key
from bridge_freeze_plugin.request import FLAGS, PATTERN_KEYS


def _plugin_key(key: str) -> str | None:
    """``"flag"`` for a freeze flag or pattern key (or a near-misspelling of a flag), ``"lr"`` for a key shaped
    like a per-part learning rate, else ``None``."""
    if looks_like_lr_key(key):
        return "lr"
    if key in FLAGS or key in PATTERN_KEYS or difflib.get_close_matches(key.lower(), FLAGS, n=1,
                                                                         cutoff=MISSPELLING_CUTOFF):
        return "flag"
    return None


def _homes_text(layout: Layout) -> str:
    """Where the flags and patterns go, in words."""
    if not layout.homes.flag_homes:
        return f"the flags and patterns go under {layout.homes.flags}"
    elsewhere: dict[str, list[str]] = {}
    for key, home in layout.homes.flag_homes.items():
        elsewhere.setdefault(home, []).append(key)
    rest = "; ".join(f"{', '.join(keys)} under {home}" for home, keys in elsewhere.items())
    here = [key for key in PLUGIN_KEYS if key not in layout.homes.flag_homes]
    return f"{', '.join(here)} go under {layout.homes.flags}; {rest}"


def _own_here(cfg: Any, layout: Layout, where: str, key: str) -> bool:
    """Whether ``where.key`` is Bridge's or the trainer's own ``freeze_*`` setting (never one of the plugin's)."""
    if layout.homes.own_setting(where, key) is not None:
        return True
    return (key in FLAGS and where == layout.lora.section and bool(layout.lora.vlm_targets)
            and select(cfg, f"{layout.lora.section}._target_") in layout.lora.vlm_targets)


def _unset(value: Any) -> bool:
    return value is None or value is False or value == [] or value == ""


def survey(cfg: Any, layout: Layout, source: Source) -> tuple[list[str], list[str], tuple[OwnFreeze, ...]]:
    """One walk of the config's keys: the plugin keys written where ``layout``'s runs never read them (refused:
    :func:`_misplaced`), the other ``freeze_*`` keys it reads nowhere (said: :func:`unread_freeze_keys`), and
    Bridge's and the trainer's own ``freeze_*`` settings of the policy (:func:`_own_freeze`)."""
    keys, referenced = _all_keys(cfg)
    return (_misplaced(cfg, layout, keys, referenced), _unread(cfg, layout, keys, referenced),
            _own_freeze(cfg, layout, source, keys))


def _misplaced(cfg: Any, layout: Layout, keys: list[tuple[str, str]], referenced: set[str]) -> list[str]:
    """Flags, patterns and learning rates written where ``layout``'s runs never read them (they would be dropped).

    The whole config is walked (keys only, nothing resolved). In a section some layout reads the plugin's keys
    from, any key shaped like one counts (a near-misspelt flag, ``lr_vision``...); anywhere else, the exact names
    (``trainer.critic.megatron_config.freeze_vision_model``, ``optimizer.lr_vision_model``). Only the chosen
    layout's own sections are read (each plugin key in its home: :meth:`Layout.home`); a flag under its
    reference model is left to the reference rule; Bridge's and the trainer's own ``freeze_*`` settings
    (``VLMLoRA``'s switches, NeMo-RL's ``freeze_config``) are theirs, not misplaced.
    """
    sections = set(plugin_sections())
    problems = []
    for where, key in keys:
        if any(where == ref or where.startswith(ref + ".") for ref in referenced):
            continue  # read through an interpolation (megatron_config: ${base}): judged where it is used
        kind = _plugin_key(key) if where in sections else _exact_plugin_key(key)
        if kind is None or _own_here(cfg, layout, where, key):
            continue
        dotted = _dotted(where, key)
        never = layout.homes.reference_of(where)
        if never is not None:
            if not _unset(_quiet(cfg, dotted)):
                problems.append(
                    f"{dotted}: {never} never trains, so a freeze flag, pattern or learning rate there has no "
                    f"meaning. Remove it (or set it false / empty if a YAML merge copied it from the policy); the "
                    f"policy's go under {layout.lr_section if kind == 'lr' else layout.homes.flags}"
                    + (f" ({_homes_text(layout)})" if layout.homes.flag_homes and kind == "flag" else ""))
            continue
        if kind == "flag":
            exact = key in PLUGIN_KEYS
            if where == layout.homes.reference_flags or (exact and where == layout.homes.home(key)) or (
                    not exact and where in layout.homes.plugin_homes):
                continue  # read (a near-misspelling in a home section: reading names the flag it means)
            if exact and where in layout.homes.plugin_homes:
                problems.append(f"{dotted} is not applied in a {layout.title} run: "
                                f"{layout.homes.section_notes[where]}. Write {layout.homes.key(key)} instead")
                continue
            home = layout.homes.key(key) if exact else f"{layout.homes.flags}.{key}"
            problems.append(
                f"{dotted} is not read in the {layout.title} layout, so the run would ignore it: "
                f"{_homes_text(layout)}. Write {home} instead"
            )
        elif kind == "lr" and layout.rates.refused is not None:
            problems.append(f"{dotted}: {layout.rates.refused}")
        elif kind == "lr" and where == layout.homes.reference_flags:
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
    :func:`_misplaced`), the keys of the sections the plugin's keys are read from (checked there: an unknown
    ``freeze_*`` key is an error), Bridge's and the trainer's own settings where the layout knows them, and what
    is read through an interpolation (judged where it is used). What is left is a setting of another config
    layout, or of no trainer: a run of this layout never reads it.
    """
    return _unread(cfg, layout, *_all_keys(cfg))


def _unread(cfg: Any, layout: Layout, keys: list[tuple[str, str]], referenced: set[str]) -> list[str]:
    homes = {*layout.homes.plugin_homes, layout.homes.reference_flags}
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


def _own_freeze(cfg: Any, layout: Layout, source: Source, keys: list[tuple[str, str]]) -> tuple[OwnFreeze, ...]:
    """Bridge's and the trainer's own ``freeze_*`` settings of the policy the config writes (not the references')."""
    out = []
    for where, key in keys:
        if not key.startswith("freeze_") or layout.homes.reference_of(where) or where == layout.homes.reference_flags:
            continue
        setting = layout.homes.own_setting(where, key)
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
    if not layout.rates.targets:
        return f": per-part learning rates go under {layout.lr_section}. Write {layout.lr_section}.{key} instead"
    target = layout.rates.targets[0]
    provider = target.rpartition(".")[2]
    what = ("a learning rate written on the model provider is never applied" if where == layout.homes.flags
            else "per-part learning rates are not read there")
    return (f": {what}. A Megatron-Bridge run takes per-part learning rates from its optimizer override "
            f"provider: write {layout.lr_section}: {{_target_: {target}, {key}: ...}} (in code: "
            f"cfg.{layout.lr_section} = {provider}({key}=...))")
