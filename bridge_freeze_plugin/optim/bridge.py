"""Bridge's ``setup()`` with per-part learning rates and no code: an optimizer-override provider.

``cfg.optimizer_config_override_provider = PartLROverrideProvider(lr_vision_projection=1e-3, ...)`` (or the
same under ``_target_`` in a YAML config). It has the shape of Bridge's ``OptimizerConfigOverrideProvider``
(one method, ``build_config_overrides(context)``) without importing Bridge's training package. Bridge calls
it with the DDP-wrapped model right before it builds the optimizer; it returns megatron-core's standard
overrides plus the per-part ones, after every check that can fail before the build (frozen part, optimizer
kind, muP, warm-up).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from bridge_freeze_plugin.optim._overrides import part_lr_overrides
from bridge_freeze_plugin.optim._settings import LR_KEYS, PartLearningRates

if TYPE_CHECKING:
    from megatron.core.optimizer.optimizer_config import ParamKey
    from megatron.core.optimizer_param_scheduler import ParamGroupOverride


def _with_lr_fields(cls: type) -> type:
    """One ``float | None`` field per learning-rate key (``lr_<part>``, ``min_lr_<part>``; every part of the
    vocabulary and the adapters), default ``None``."""
    cls.__annotations__ = {**dict.fromkeys(LR_KEYS, "float | None"), **inspect.get_annotations(cls)}
    for key in LR_KEYS:
        setattr(cls, key, None)
    return cls


@dataclass
@_with_lr_fields
class PartLROverrideProvider:
    """Per-part learning rates for Bridge's optimizer (unset: the part follows the global schedule): a field
    ``lr_<part>`` / ``min_lr_<part>`` per part (``lr_vision_projection``, ``lr_audio_model``...) and the adapters."""

    def __post_init__(self) -> None:
        self.rates()  # a malformed value fails here, when the config is made

    def rates(self) -> PartLearningRates:
        return PartLearningRates.of(**{f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def from_rates(cls, rates: PartLearningRates) -> PartLROverrideProvider:
        return cls(**rates.as_dict())

    def build_config_overrides(self, context: Any) -> dict[ParamKey, ParamGroupOverride] | None:
        """Bridge's hook: ``context`` has ``optimizer_config``, ``scheduler_config`` and ``model``."""
        scheduler = context.scheduler_config
        overrides = part_lr_overrides(
            context.optimizer_config,
            context.model,
            self.rates(),
            lr_warmup_init=float(getattr(scheduler, "lr_warmup_init", 0.0) or 0.0),
            lr_warmup_steps=int(getattr(scheduler, "lr_warmup_steps", 0) or 0),
        )
        return overrides or None
