"""Per-part learning rates (language model, vision encoder, vision projection, LoRA adapters).

- :mod:`.settings`: the config keys, read and checked (no torch): :func:`read_part_learning_rates`;
- :mod:`.overrides`: megatron-core parameter-group overrides, checked before the build: :func:`part_lr_overrides`;
- :mod:`.bridge`: the same for Bridge's ``setup()``: :class:`PartLROverrideProvider`;
- :mod:`.verify`: after the build, each part's LR is what was asked: :func:`verify_part_learning_rates`.

Importing any of these modules imports no torch and no Megatron; megatron-core loads when overrides are built.
"""

from __future__ import annotations

import importlib
from typing import Any

from bridge_freeze_plugin.optim.settings import (
    ADAPTERS,
    LR_KEYS,
    LR_PARTS,
    PartLearningRates,
    PartLR,
    read_part_learning_rates,
)

_LAZY = {
    "part_lr_overrides": "bridge_freeze_plugin.optim.overrides",
    "PartLROverrideProvider": "bridge_freeze_plugin.optim.bridge",
    "verify_part_learning_rates": "bridge_freeze_plugin.optim.verify",
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
    "PartLR",
    "PartLROverrideProvider",
    "PartLearningRates",
    "part_lr_overrides",
    "read_part_learning_rates",
    "verify_part_learning_rates",
]
