"""Reading training configs: loading (YAML, defaults list, overrides), layouts as data, and reading the
settings the rules need, each with where its value came from. The rules live in :mod:`bridge_freeze_plugin.rules`."""

from bridge_freeze_plugin.config.family import family_from_model_path, family_from_target
from bridge_freeze_plugin.config.layouts import BRIDGE, LAYOUTS, RL, SFT, Layout
from bridge_freeze_plugin.config.loading import Override, Provenance, parse_override
from bridge_freeze_plugin.config.reading import LoraSettings, RunSettings, Setting, read_selection, read_settings
from bridge_freeze_plugin.config.source import LoadedConfig, choose_layout, load, load_config, with_layout

__all__ = [
    "BRIDGE",
    "LAYOUTS",
    "RL",
    "SFT",
    "Layout",
    "LoadedConfig",
    "LoraSettings",
    "Override",
    "Provenance",
    "RunSettings",
    "Setting",
    "choose_layout",
    "family_from_model_path",
    "family_from_target",
    "load",
    "load_config",
    "parse_override",
    "read_selection",
    "read_settings",
    "with_layout",
]
