"""bridge-freeze-plugin: choose which parts of a vision-language model train on Megatron-Bridge.

One flag per part of the vocabulary, five today (``freeze_language_model``, ``freeze_vision_model``,
``freeze_vision_projection``, ``freeze_audio_model``, ``freeze_audio_projection``), optional train / freeze
patterns, a registry of VLM families (the module prefixes of each part), and Bridge's own providers patched to
apply the selection before the DDP wrap. Importing this package imports neither torch nor Megatron.

The top level is the subsystems, each a folder behind its face (its ``__init__``), in the order a request flows:
:mod:`~bridge_freeze_plugin.request` (what is asked) -> :mod:`~bridge_freeze_plugin.config` (a training config
read and checked) -> :mod:`~bridge_freeze_plugin.families` (family lookup) -> :mod:`~bridge_freeze_plugin.activation`
(Bridge's providers honour the flags) -> :mod:`~bridge_freeze_plugin.prewrap` (the build: freeze, hooks,
guarantee, report) -> :mod:`~bridge_freeze_plugin.optim` (per-part learning rates) and
:mod:`~bridge_freeze_plugin.export` (RL weight sync, adapter exports); :mod:`~bridge_freeze_plugin.audit` (the run:
what learned in the first optimizer steps, and that nothing frozen moved); :mod:`~bridge_freeze_plugin.planning` and
:mod:`~bridge_freeze_plugin.cli` are the ``bridge-freeze`` command. docs/architecture.md draws it.
"""

import importlib
from typing import Any

from bridge_freeze_plugin import registry as _registry  # noqa: F401  (registers the built-ins)
from bridge_freeze_plugin.activation import activate, deactivate, is_active
from bridge_freeze_plugin.audit import AuditReport, audit_step, last_audit
from bridge_freeze_plugin.errors import (
    AdapterExportError,
    BridgeFreezeError,
    CommandError,
    ConfigLoadError,
    EmptyPartError,
    FamilyRegistrationError,
    FreezeFlagTypeError,
    FreezeGuaranteeError,
    FrozenPartTrainedError,
    InvalidFreezeConfigError,
    InvalidPatternError,
    LoraOverlapError,
    NothingTrainsError,
    PartLearningRateError,
    PartNotInFamilyError,
    PeerRankFreezeError,
    PlanError,
    RecipeError,
    SelectionChange,
    SelectionChangedError,
    TrainableOnlyCheckpointError,
    TrainableSyncError,
    TrainingAuditError,
    UnadaptableLoraTargetError,
    UnclassifiedParameterError,
    UnexportableAdapterError,
    UnknownFamilyError,
    UnmatchedPatternError,
    UnsupportedFreezeFlagError,
    Violation,
)
from bridge_freeze_plugin.export import export_trainable_hf_weights
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.mixins import FreezableVLMProvider, freezable_class, make_freezable
from bridge_freeze_plugin.prewrap import FreezeReport, PartCount, apply_selection, last_report, trainable_state_dict
from bridge_freeze_plugin.registry import REGISTRY, family_for_provider, get_family, list_families, register_family
from bridge_freeze_plugin.request import FLAGS, VOCABULARY, FreezeSelection, Part, PartInfo

# Config validation needs OmegaConf: loaded on first use, so importing the plugin stays light.
_LAZY = {
    name: "bridge_freeze_plugin.config"
    for name in (
        "LoraSettings",
        "load_config",
        "read_selection",
        "validate_config",
        "validate_rl_config",
        "validate_selection",
        "validate_sft_config",
    )
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'bridge_freeze_plugin' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__version__ = "0.1.0"

__all__ = [
    "FLAGS",
    "REGISTRY",
    "VOCABULARY",
    "AdapterExportError",
    "AuditReport",
    "BridgeFreezeError",
    "CommandError",
    "ConfigLoadError",
    "EmptyPartError",
    "FamilyRegistrationError",
    "FamilySpec",
    "FreezableVLMProvider",
    "FreezeFlagTypeError",
    "FreezeGuaranteeError",
    "FreezeReport",
    "FreezeSelection",
    "FrozenPartTrainedError",
    "InvalidFreezeConfigError",
    "InvalidPatternError",
    "LoraOverlapError",
    "LoraSettings",
    "NothingTrainsError",
    "Part",
    "PartCount",
    "PartInfo",
    "PartLearningRateError",
    "PartNotInFamilyError",
    "PeerRankFreezeError",
    "PlanError",
    "RecipeError",
    "SelectionChange",
    "SelectionChangedError",
    "TrainableOnlyCheckpointError",
    "TrainableSyncError",
    "TrainingAuditError",
    "UnadaptableLoraTargetError",
    "UnclassifiedParameterError",
    "UnexportableAdapterError",
    "UnknownFamilyError",
    "UnmatchedPatternError",
    "UnsupportedFreezeFlagError",
    "Violation",
    "__version__",
    "activate",
    "apply_selection",
    "audit_step",
    "deactivate",
    "export_trainable_hf_weights",
    "family_for_provider",
    "freezable_class",
    "get_family",
    "is_active",
    "last_audit",
    "last_report",
    "list_families",
    "load_config",
    "make_freezable",
    "read_selection",
    "register_family",
    "trainable_state_dict",
    "validate_config",
    "validate_rl_config",
    "validate_selection",
    "validate_sft_config",
]


# Importing the plugin is all a user does: from here on, every registered family's Bridge provider
# honours the flags (providers are patched when their modules are imported; nothing heavy now).
activate()
