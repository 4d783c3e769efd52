"""Reading training configs: YAML files and overrides (``yaml_overrides``), defaults lists (``compose``), the effective
config (``source``), layouts as data (``layouts``), and reading the
settings the rules need, each with where its value came from. The rules live in :mod:`bridge_freeze_plugin.rules`."""

from bridge_freeze_plugin.config.family import family_from_model_path, family_from_target
from bridge_freeze_plugin.config.layouts import BRIDGE, LAYOUTS, RL, SFT, Layout
from bridge_freeze_plugin.config.reading import LoraSettings, RunSettings, Setting, read_selection, read_settings
from bridge_freeze_plugin.config.source import LoadedConfig, choose_layout, load, load_config, with_layout
from bridge_freeze_plugin.config.yaml_overrides import Override, Provenance, parse_override

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
