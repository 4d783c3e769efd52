"""Configuration: reading a training config and checking the freeze rules on it, before anything is built.

- :mod:`._yaml_overrides`, :mod:`._yaml_files`: ``key=value`` overrides and YAML files, each value with where it
  came from;
- :mod:`._compose`: defaults lists (Hydra / NeMo-RL style composition);
- :mod:`._source`: the effective config and the layout it is read with;
- :mod:`._layouts`: the :class:`Layout` record, made of one record per job (:mod:`._layout_records`: where the
  plugin's keys live, :class:`Homes`; the model's, LoRA's, the strategy's and recompute's, the learning rates'
  keys; what the trainer does with a config, :class:`TrainerFacts`); each trainer's layout as data, one module
  each (:mod:`._layout_sft_rl`, :mod:`._layout_bridge`, :mod:`._layout_nemorl`); :mod:`._layout_detect`: the
  layouts by name, and which one a file is;
- :mod:`._skyrl_fields`, :mod:`._skyrl`: SkyRL's config classes (installed, else a committed listing), what its
  loader refuses, and where its Megatron worker reads the flags (``transformer_config_kwargs``);
- :mod:`._yaml_tags`: YAML loaders that read SkyRL's dumped enum tags as values;
- :mod:`._reading`: the settings the rules need (flags, patterns, LoRA, learning rates), each with its source, read
  into :class:`RunSettings` (:mod:`._run_settings`: grouped by job, :class:`SelectionSources`,
  :class:`RunSwitches`, :class:`LoraRead`, :class:`RateSettings`) by job: values and their sources
  (:mod:`._values`), the flags and patterns (:mod:`._flags`), keys written where they are not read
  (:mod:`._misplaced`), the other settings (:mod:`._setting_readers`);
- :mod:`._conversion_cache`, :mod:`._saved_provider`: NeMo-RL's conversion cache (the provider a run builds from)
  and the flag values it holds for the flags a config does not write;
- :mod:`._family`: the config's family (``_target_``, model path or name), without importing a config's code;
- :mod:`._rules`: the freeze rules over those settings; :mod:`._lora_rules`: the LoRA rules (and
  :mod:`._lora_targets`: which plain ``torch.nn.Linear`` modules a LoRA target reaches); :mod:`._checks`: the
  check, stage by stage (config rules, provider and family, LoRA rules, full recompute);
- :mod:`._validation`: the entry points (:func:`validate_config`, :func:`load_run`...).

Importing this package imports OmegaConf (the plugin's top level imports it lazily, on first use).
"""

from bridge_freeze_plugin.config._family import family_from_model_path, family_from_name, family_from_target
from bridge_freeze_plugin.config._flags import read_selection
from bridge_freeze_plugin.config._layout_bridge import BRIDGE
from bridge_freeze_plugin.config._layout_detect import LAYOUTS
from bridge_freeze_plugin.config._layout_nemorl import NEMO_RL
from bridge_freeze_plugin.config._layout_records import (
    Homes,
    LoraKeys,
    ModelKeys,
    OwnSetting,
    Peer,
    RateKeys,
    StrategyKeys,
    TrainerFacts,
)
from bridge_freeze_plugin.config._layout_sft_rl import RL, SFT
from bridge_freeze_plugin.config._layouts import Layout, Marker, resolvers
from bridge_freeze_plugin.config._lora_rules import lora_adapter_parts, vlm_lora_effect
from bridge_freeze_plugin.config._reading import read_settings
from bridge_freeze_plugin.config._rules import MEGATRON
from bridge_freeze_plugin.config._run_settings import (
    LoraRead,
    LoraSettings,
    RateSettings,
    RunSettings,
    RunSwitches,
    SelectionSources,
)
from bridge_freeze_plugin.config._source import LoadedConfig, choose_layout, load, load_config, with_layout
from bridge_freeze_plugin.config._validation import (
    ConfigRun,
    load_run,
    validate_bridge_config,
    validate_config,
    validate_rl_config,
    validate_selection,
    validate_sft_config,
)
from bridge_freeze_plugin.config._values import Setting, select
from bridge_freeze_plugin.config._yaml_overrides import Override, Provenance, parse_override

__all__ = [
    "BRIDGE",
    "LAYOUTS",
    "MEGATRON",
    "NEMO_RL",
    "RL",
    "SFT",
    "ConfigRun",
    "Homes",
    "Layout",
    "LoadedConfig",
    "LoraKeys",
    "LoraRead",
    "LoraSettings",
    "Marker",
    "ModelKeys",
    "Override",
    "OwnSetting",
    "Peer",
    "Provenance",
    "RateKeys",
    "RateSettings",
    "RunSettings",
    "RunSwitches",
    "SelectionSources",
    "Setting",
    "StrategyKeys",
    "TrainerFacts",
    "choose_layout",
    "family_from_model_path",
    "family_from_name",
    "family_from_target",
    "load",
    "load_config",
    "load_run",
    "lora_adapter_parts",
    "parse_override",
    "read_selection",
    "read_settings",
    "resolvers",
    "select",
    "validate_bridge_config",
    "validate_config",
    "validate_rl_config",
    "validate_selection",
    "validate_sft_config",
    "vlm_lora_effect",
    "with_layout",
]
