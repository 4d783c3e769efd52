"""Per-part learning rates (one per part of the vocabulary: language model, vision and audio encoders and
projections; and LoRA adapters).

- :mod:`._settings`: the config keys, read and checked (no torch): :func:`read_part_learning_rates`;
- :mod:`._overrides`: megatron-core parameter-group overrides, checked before the build: :func:`part_lr_overrides`;
- :mod:`.bridge`: the same for Bridge's ``setup()``: :class:`PartLROverrideProvider` (a public module name: Bridge
  writes the class's path into ``run_config.yaml`` as ``_target_`` and refuses a path with a private segment);
- :mod:`._verify`: after the build, each part's LR is what was asked: :func:`verify_part_learning_rates`;
- :mod:`._setup_check`: Bridge's ``setup_optimizer`` runs that check (wrapped by activation).

Importing any of these modules imports no torch and no Megatron; megatron-core loads when overrides are built.
"""

from __future__ import annotations

import importlib
from typing import Any

from bridge_freeze_plugin.optim._settings import (
    ADAPTERS,
    LR_KEYS,
    LR_PARTS,
    MEGATRON_LR_SETTINGS,
    PartLearningRates,
    PartLR,
    looks_like_lr_key,
    read_part_learning_rates,
)
from bridge_freeze_plugin.optim._setup_check import MODULES as SETUP_OPTIMIZER_MODULES
from bridge_freeze_plugin.optim._setup_check import NAME as SETUP_OPTIMIZER
from bridge_freeze_plugin.optim._setup_check import checked as checked_setup_optimizer

_LAZY = {
    "part_lr_overrides": "bridge_freeze_plugin.optim._overrides",
    "PartLROverrideProvider": "bridge_freeze_plugin.optim.bridge",
    "verify_part_learning_rates": "bridge_freeze_plugin.optim._verify",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'bridge_freeze_plugin.optim' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "ADAPTERS",
    "LR_KEYS",
    "LR_PARTS",
    "MEGATRON_LR_SETTINGS",
    "SETUP_OPTIMIZER",
    "SETUP_OPTIMIZER_MODULES",
    "PartLR",
    "PartLROverrideProvider",
    "PartLearningRates",
    "checked_setup_optimizer",
    "looks_like_lr_key",
    "part_lr_overrides",
    "read_part_learning_rates",
    "verify_part_learning_rates",
]
