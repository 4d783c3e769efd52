"""Bridge's ``setup()`` with per-part learning rates and no code: an optimizer-override provider.

``cfg.optimizer_config_override_provider = PartLROverrideProvider(lr_vision_projection=1e-3, ...)`` (or the
same under ``_target_`` in a YAML config). It has the shape of Bridge's ``OptimizerConfigOverrideProvider``
(one method, ``build_config_overrides(context)``) without importing Bridge's training package. Bridge calls
it with the DDP-wrapped model right before it builds the optimizer; it returns megatron-core's standard
overrides plus the per-part ones, after every check that can fail before the build (frozen part, optimizer
kind, muP, warm-up).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from bridge_freeze_plugin.optim.overrides import part_lr_overrides
from bridge_freeze_plugin.optim.settings import PartLearningRates

if TYPE_CHECKING:
    from megatron.core.optimizer.optimizer_config import ParamKey
    from megatron.core.optimizer_param_scheduler import ParamGroupOverride


@dataclass
class PartLROverrideProvider:
    """Per-part learning rates for Bridge's optimizer (unset: the part follows the global schedule)."""

    lr_language_model: float | None = None
    min_lr_language_model: float | None = None
    lr_vision_model: float | None = None
    min_lr_vision_model: float | None = None
    lr_vision_projection: float | None = None
    min_lr_vision_projection: float | None = None
    lr_adapters: float | None = None
    min_lr_adapters: float | None = None

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
