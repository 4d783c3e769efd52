"""Configuration: reading a training config and checking the freeze rules on it, before anything is built.

Reading one config (:func:`load_run`) is a pipeline of stages; each calls down into helpers of its own and into
one layer below them all (the values: :mod:`._values`, :mod:`._yaml_overrides`):

1. the file (:mod:`._source`: :func:`load`): YAML files and ``key=value`` overrides, each value with where it came
   from (:mod:`._yaml_files`, :mod:`._yaml_overrides`), defaults lists composed (:mod:`._compose`);
2. the layout (:mod:`._source`: :func:`choose_layout`, :func:`with_layout`): detected or forced
   (:mod:`._layout_detect`: the layouts by name, and which one a file is), a SkyRL layout as the SkyRL here reads
   it (:mod:`._skyrl`, what its loader refuses: :mod:`._skyrl_loader`, its classes: :mod:`._skyrl_fields`;
   :mod:`._yaml_tags`: its dumped enum tags), then the layout's defaults. The layouts are data: the
   :class:`Layout` record (:mod:`._layouts`), made of one record per job (:mod:`._layout_records`), and one table
   per trainer (:mod:`._layout_sft_rl`, :mod:`._layout_bridge`, :mod:`._layout_nemorl`);
3. the family (:mod:`._family`): the caller's, a local checkpoint's ``model_type``, a guess from the name, or the
   provider class, without importing a config's code;
4. the reading (:mod:`._reading`: :func:`read_settings`) into :class:`RunSettings` (:mod:`._run_settings`): one
   survey of the keys (:mod:`._misplaced`: keys written where they are not read), the sections read in one place,
   the flags and patterns (:mod:`._flags`), the settings next to them (:mod:`._setting_readers`);
5. the provider's defaults (:mod:`._provider_defaults`): the flags a config does not write, as the provider keeps
   them, fresh or saved (:mod:`._conversion_cache`: NeMo-RL's conversion cache).

Then the rules: :mod:`._rules` (the freeze rules), :mod:`._lora_rules` (and :mod:`._lora_targets`: which plain
``torch.nn.Linear`` modules a LoRA target reaches), :mod:`._recompute_rules`; :mod:`._checks`: the check, stage by
stage (config rules, provider and family, LoRA rules, full recompute); :mod:`._validation`: the entry points
(:func:`validate_config`, :func:`load_run`...).

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
