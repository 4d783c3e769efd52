"""A run's effective config: the file, its composed defaults list, the layout's defaults, the overrides.

Each value keeps where it came from. Layout defaults fill only what nothing else wrote (they are what
the trainer itself would use); the overrides are applied last, in order, as Hydra applies them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from bridge_freeze_plugin.config import _layout_detect as layouts
from bridge_freeze_plugin.config._compose import compose
from bridge_freeze_plugin.config._layouts import Layout, resolvers
from bridge_freeze_plugin.config._misplaced import unread_freeze_keys
from bridge_freeze_plugin.config._skyrl import adapt
from bridge_freeze_plugin.config._values import IN_CONFIG
from bridge_freeze_plugin.config._yaml_files import read_yaml_file
from bridge_freeze_plugin.config._yaml_overrides import (
    BLOCKED,
    FOUND,
    Override,
    Provenance,
    apply_override,
    check_depth,
    lookup,
    parse_override,
)
from bridge_freeze_plugin.errors import ConfigLoadError

#: The source of a key the config does not have (its value is the rules' "unset").
NOT_WRITTEN = "not written"
#: How many unread keys an error names.
_SHOWN = 8


@dataclass(frozen=True)
class LoadedConfig:
    """The effective config and where each of its values came from."""

    cfg: DictConfig
    provenance: Provenance
    overrides: tuple[Override, ...] = ()
    path: Path | None = None
    #: files pulled in by the defaults list, relative to the config's folder
    composed: tuple[str, ...] = ()
    layout: Layout | None = None
    #: why this layout (detected from the file, or forced)
    layout_reason: str | None = None
    #: keys whose value is the layout's default
    defaulted: tuple[str, ...] = ()
    #: overrides ``key=value`` that added a key the config did not have (Hydra's struct mode refuses them)
    added_by_set: tuple[str, ...] = ()

    def source(self, key: str) -> str:
        """Where ``key``'s value came from; ``not written`` when the config does not have the key."""
        if lookup(self.cfg, key)[0] != FOUND:
            return NOT_WRITTEN
        return self.provenance.source(key) or IN_CONFIG


def load(path: str | os.PathLike[str] | None = None, overrides: Iterable[str] = ()) -> LoadedConfig:
    """The file (defaults list composed) with the overrides applied; no layout defaults yet."""
    provenance = Provenance()
    composed: tuple[str, ...] = ()
    file = None if path is None else Path(path)
    if file is None:
        cfg: DictConfig = OmegaConf.create({})
    else:
        cfg, composed = compose(read_yaml_file(file), file.parent, file.name, provenance)
    parsed = tuple(parse_override(text) for text in overrides)
    added = []
    for override in parsed:
        if override.operation == "set" and lookup(cfg, override.key)[0] != FOUND:
            added.append(override.text)
        cfg = apply_override(cfg, override, provenance)
    check_depth(cfg, "the config (file, defaults list and overrides together)")
    return LoadedConfig(cfg, provenance, parsed, file, composed, added_by_set=tuple(added))


def _what(loaded: LoadedConfig) -> str:
    if loaded.path is not None:
        return str(loaded.path)
    return "the overrides" if loaded.overrides else "an empty command line"


def choose_layout(loaded: LoadedConfig, forced: str | None = None) -> tuple[Layout, str]:
    """The layout: detected from the config, weighing all its evidence; ``forced`` must not contradict the file.

    A forced layout is refused when the file has keys that decide another layout and none that decide it, and
    when any ``freeze_*`` key of the file is one it reads nowhere (:func:`._misplaced.unread_freeze_keys`: a
    foreign config's settings); whatever evidence it outweighs is said in the reason. A SkyRL layout is then read
    as the SkyRL here reads the config (its loader's refusals raise: :func:`._skyrl.adapt`).
    """
    what = _what(loaded)
    top = OmegaConf.to_container(loaded.cfg, resolve=False)
    assert isinstance(top, dict)
    if forced is None:
        layout, why = layouts.detect(top, what)
        reason = f"detected: {why}"
    else:
        layout, reason = _forced(top, forced, what)
    layout, checked = adapt(loaded.cfg, layout, loaded.overrides)
    if forced is not None:
        with resolvers(layout):
            unread = unread_freeze_keys(loaded.cfg, layout)
        if unread:
            shown = ", ".join(unread[:_SHOWN]) + (f" and {len(unread) - _SHOWN} more" if len(unread) > _SHOWN else "")
            raise ConfigLoadError(
                f"{what} has freeze settings the {layout.title} layout asked for does not read: {shown}. A forced "
                f"layout never reads a foreign config silently: these belong to another trainer's config (or to "
                f"none), and a run in that layout would ignore them. Drop the layout option (the layout is "
                f"detected), or remove them"
            )
    return layout, reason if checked is None else f"{reason}; {checked}"


def _forced(top: dict[str, Any], forced: str, what: str) -> tuple[Layout, str]:
    """The layout named ``forced``, and the reason with what it overrules; refused when the file has keys that
    decide another layout and none that decide it."""
    layout = layouts.get(forced)
    found = layouts.evidence(top)
    own = found.get(layout.name)
    deciding = [e for e in found.values() if e.decides and e.layout is not layout]
    if deciding and (own is None or not own.decides):
        seen = deciding[0]
        raise ConfigLoadError(
            f"{what} is written in the {seen.layout.title} layout ({seen.why()}), not the {layout.title} "
            f"layout asked for; the {layout.title} keys ({layout.homes.flags}...) would read nothing. Drop the layout "
            f"option (it is detected), or give a {layout.title} config"
        )
    others = [e for e in found.values() if e.layout.name != layout.name]
    reason = "forced with --layout" + (f" (the file agrees: {own.why()})" if own is not None else "")
    if others:
        reason += "; conflicting evidence, overruled: " + "; ".join(
            f"{e.why()} suggests the {e.layout.title} layout" for e in others)
    return layout, reason


def with_layout(loaded: LoadedConfig, layout: Layout, reason: str) -> LoadedConfig:
    """``loaded`` with the layout's defaults filled in where nothing wrote the key.

    A default fills a key only when the key is absent and every level above it is a mapping or absent: a
    level the user wrote as something else (``megatron_config: 5``, a list, null, an interpolation) is the
    user's value, kept for the reading to judge, never overwritten. (Below an interpolation that resolves to a
    mapping, the trainer's default still applies at run time but is not shown here; the build decides the
    full-recompute adjustment from the provider's real settings either way.)
    """
    if layout.run.strict_overrides and loaded.path is not None and loaded.added_by_set:
        shown = ", ".join(repr(text) for text in loaded.added_by_set)
        raise ConfigLoadError(
            f"{shown}: {layout.trainer} applies command-line overrides in Hydra's struct mode, where key=value "
            f"must name a key the config has, so it refuses to add one (Could not override ...). Write "
            f"+key=value to add it (++key=value: add or set)"
        )
    cfg = loaded.cfg.copy()
    filled = []
    for key, value in layout.run.defaults.items():
        state, node, _ = lookup(cfg, key)
        if state == BLOCKED or (state == FOUND and not node._is_missing()):
            continue  # a value the user wrote (null included: the user's value, not a gap)
        OmegaConf.update(cfg, key, value, force_add=True)
        loaded.provenance.record(key, value, f"default of the {layout.title} layout")
        filled.append(key)
    return LoadedConfig(cfg, loaded.provenance, loaded.overrides, loaded.path, loaded.composed, layout, reason,
                        tuple(filled), loaded.added_by_set)


def load_config(path: str | os.PathLike[str] | None = None, overrides: Iterable[str] = ()) -> DictConfig:
    """A training config: the YAML file at ``path`` (if any, its defaults list composed) with dotted
    ``key=value`` overrides (also ``+key=value``, ``++key=value``, ``~key``) applied on top."""
    return load(path, overrides).cfg
