"""A run's effective config: the file, its composed defaults list, the layout's defaults, the overrides.

Each value keeps where it came from. Layout defaults fill only what nothing else wrote (they are what
the trainer itself would use); the overrides are applied last, in order, as Hydra applies them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bridge_freeze_plugin.config import layouts
from bridge_freeze_plugin.config.compose import compose
from bridge_freeze_plugin.config.layouts import Layout
from bridge_freeze_plugin.config.loading import Override, Provenance, apply_overrides, read_yaml_file
from bridge_freeze_plugin.config.reading import IN_CONFIG
from bridge_freeze_plugin.errors import ConfigLoadError

#: The source of a key the config does not have (its value is the rules' "unset").
NOT_WRITTEN = "not written"
_ABSENT = object()


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

    def source(self, key: str) -> str:
        """Where ``key``'s value came from; ``not written`` when the config does not have the key."""
        if OmegaConf.select(self.cfg, key, default=_ABSENT) is _ABSENT:
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
    cfg, parsed = apply_overrides(cfg, overrides, provenance)
    return LoadedConfig(cfg, provenance, parsed, file, composed)


def _what(loaded: LoadedConfig) -> str:
    if loaded.path is not None:
        return str(loaded.path)
    return "the overrides" if loaded.overrides else "an empty command line"


def choose_layout(loaded: LoadedConfig, forced: str | None = None) -> tuple[Layout, str]:
    """The layout: detected from the config; ``forced`` must agree with what the file shows."""
    top = OmegaConf.to_container(loaded.cfg, resolve=False)
    assert isinstance(top, dict)
    if forced is None:
        layout, why = layouts.detect(top, _what(loaded))
        return layout, f"detected: {why}"
    layout = layouts.get(forced)
    try:
        seen, why = layouts.detect(top, _what(loaded))
    except ConfigLoadError:
        return layout, "forced with --layout"
    if seen is not layout:
        raise ConfigLoadError(
            f"{_what(loaded)} is written in the {seen.title} layout ({why}), not the {layout.title} layout asked "
            f"for; the {layout.title} keys ({layout.flags}...) would read nothing. Drop the layout option "
            f"(it is detected), or give a {layout.title} config"
        )
    return layout, "forced with --layout (and the file agrees)"


def with_layout(loaded: LoadedConfig, layout: Layout, reason: str) -> LoadedConfig:
    """``loaded`` with the layout's defaults filled in where nothing wrote the key."""
    cfg = loaded.cfg.copy()
    filled = []
    for key, value in layout.defaults.items():
        if OmegaConf.select(cfg, key, default=None) is None and not _written_null(cfg, key):
            OmegaConf.update(cfg, key, value, force_add=True)
            loaded.provenance.record(key, value, f"default of the {layout.title} layout")
            filled.append(key)
    return LoadedConfig(cfg, loaded.provenance, loaded.overrides, loaded.path, loaded.composed, layout, reason,
                        tuple(filled))


def _written_null(cfg: DictConfig, key: str) -> bool:
    """Whether the config itself writes ``key: null`` (then null is the user's value, not a gap)."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
    return isinstance(node, DictConfig) and leaf in node and node._get_node(leaf)._is_none()


def load_config(path: str | os.PathLike[str] | None = None, overrides: Iterable[str] = ()) -> DictConfig:
    """A training config: the YAML file at ``path`` (if any, its defaults list composed) with dotted
    ``key=value`` overrides (also ``+key=value``, ``++key=value``, ``~key``) applied on top."""
    return load(path, overrides).cfg
