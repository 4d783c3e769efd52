"""Per-part learning rates as asked: read and checked from a mapping, no torch, no Megatron.

Keys (under ``megatron_config`` in the SFT and RL layouts; every one optional)::

    lr_language_model      min_lr_language_model
    lr_vision_model        min_lr_vision_model
    lr_vision_projection   min_lr_vision_projection
    lr_adapters            min_lr_adapters          (LoRA's adapters, every part's)

Unset means the global schedule. A set ``lr_<part>`` without ``min_lr_<part>`` keeps the global
schedule's shape: its minimum is ``lr_<part> * min_lr / lr`` (so ``0.0`` stays ``0.0`` all along).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge_freeze_plugin.errors import PartLearningRateError
from bridge_freeze_plugin.selection import SELECTABLE_PARTS, Part, type_name

#: The LR "part" of LoRA's adapters (parameters a PEFT hook added; they carry no part of their own).
ADAPTERS = "adapters"
#: Every part a learning rate can be set for, in the order reports list them.
LR_PARTS: tuple[str, ...] = (*(p.value for p in SELECTABLE_PARTS), ADAPTERS)
#: The config keys, ``lr_<part>`` and ``min_lr_<part>``.
LR_KEYS: tuple[str, ...] = tuple(f"{kind}_{part}" for part in LR_PARTS for kind in ("lr", "min_lr"))


@dataclass(frozen=True)
class PartLR:
    """One part's asked learning rate: peak ``lr`` and, when given, ``min_lr``."""

    part: str
    lr: float
    min_lr: float | None = None

    def resolve(self, global_lr: float | None, global_min_lr: float | None) -> tuple[float, float]:
        """``(max_lr, min_lr)`` this part trains with, next to the global schedule's peak and minimum."""
        if self.min_lr is not None:
            return self.lr, self.min_lr
        if global_lr is None or global_lr == 0.0 or global_min_lr is None:
            return self.lr, 0.0 if global_min_lr is None else min(global_min_lr, self.lr)
        return self.lr, self.lr * (global_min_lr / global_lr)

    def describe(self) -> str:
        low = "" if self.min_lr is None else f", min {self.min_lr:g}"
        return f"{self.part}: lr {self.lr:g}{low}"


@dataclass(frozen=True)
class PartLearningRates:
    """The per-part learning rates of a run (empty: every part follows the global schedule)."""

    parts: tuple[PartLR, ...] = field(default=())

    def __bool__(self) -> bool:
        return bool(self.parts)

    def get(self, part: str) -> PartLR | None:
        return next((p for p in self.parts if p.part == part), None)

    def names(self) -> tuple[str, ...]:
        return tuple(p.part for p in self.parts)

    def resolved(self, global_lr: float | None, global_min_lr: float | None) -> dict[str, tuple[float, float]]:
        """part -> ``(max_lr, min_lr)`` for every part with a learning rate of its own."""
        return {p.part: p.resolve(global_lr, global_min_lr) for p in self.parts}

    def as_dict(self) -> dict[str, float]:
        """The config keys that are set, with their values (what :func:`read_part_learning_rates` reads)."""
        out: dict[str, float] = {}
        for p in self.parts:
            out[f"lr_{p.part}"] = p.lr
            if p.min_lr is not None:
                out[f"min_lr_{p.part}"] = p.min_lr
        return out

    def describe(self) -> str:
        return "; ".join(p.describe() for p in self.parts) or "every part on the global schedule"

    @classmethod
    def of(cls, **values: float | None) -> PartLearningRates:
        """From keyword arguments named as the config keys (``lr_vision_projection=1e-3``...), checked."""
        return read_part_learning_rates({k: v for k, v in values.items() if v is not None}, where="")


def _number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PartLearningRateError(
            f"{key} must be a number (a learning rate such as 1e-4, or 0.0), got {value!r} of type "
            f"{type_name(value)}; write it as a number"
        )
    number = float(value)
    if not math.isfinite(number) or number < 0.0:
        raise PartLearningRateError(f"{key}={value!r}: a learning rate must be finite and >= 0; set it to e.g. 1e-4")
    return number


def _misspelt(section: Mapping[str, Any], prefix: str) -> None:
    for key in section:
        if not isinstance(key, str) or key in LR_KEYS or not key.startswith(("lr_", "min_lr_")):
            continue
        close = difflib.get_close_matches(key, LR_KEYS, n=1, cutoff=0.8)
        if close:
            raise PartLearningRateError(
                f"{prefix}{key} is not a per-part learning rate key: did you mean {prefix}{close[0]}? "
                f"The keys are {', '.join(LR_KEYS)}"
            )


def _part_lr(section: Mapping[str, Any], part: str, prefix: str) -> PartLR | None:
    lr_key, min_key = f"lr_{part}", f"min_lr_{part}"
    lr = section.get(lr_key)
    low = section.get(min_key)
    if lr is None:
        if low is not None:
            raise PartLearningRateError(
                f"{prefix}{min_key}={low!r} is set without {prefix}{lr_key}: a part's minimum needs its own "
                f"peak; set {prefix}{lr_key} too, or remove {prefix}{min_key}"
            )
        return None
    peak = _number(lr, prefix + lr_key)
    minimum = None if low is None else _number(low, prefix + min_key)
    if minimum is not None and minimum > peak:
        raise PartLearningRateError(
            f"{prefix}{min_key}={low!r} is above {prefix}{lr_key}={lr!r}: the schedule decays from the peak to "
            f"the minimum; lower {prefix}{min_key} to at most {peak:g}"
        )
    return PartLR(part, peak, minimum)


def read_part_learning_rates(
    section: Mapping[str, Any] | None,
    *,
    where: str = "megatron_config",
    frozen: Iterable[str | Part] = (),
    lora: bool | None = None,
) -> PartLearningRates:
    """Read and check the per-part learning rates of one config section (e.g. ``megatron_config``).

    ``where`` is the section's dotted path, for messages (``trainer.policy.megatron_config`` in RL).
    ``frozen``: the parts whose freeze flag is set; an LR for one of them is an error naming it.
    ``lora``: whether LoRA is on (``None``: unknown, not checked); ``lr_adapters`` without LoRA is an error.
    Raises :class:`~bridge_freeze_plugin.errors.PartLearningRateError` (an ``InvalidFreezeConfigError``)
    naming the key: a value that is not a number (``True``, ``"1e-4"``, ``None`` for a minimum alone), a
    negative or non-finite one, a minimum above its peak or without a peak, a misspelt key.
    """
    section = section or {}
    prefix = f"{where}." if where else ""
    _misspelt(section, prefix)
    parts = tuple(p for p in (_part_lr(section, part, prefix) for part in LR_PARTS) if p is not None)
    frozen_names = {Part(p).value for p in frozen}
    for p in parts:
        if p.part in frozen_names:
            raise PartLearningRateError(
                f"{prefix}lr_{p.part} is set, but the {p.part} is frozen ({prefix}freeze_{p.part}=true): a frozen "
                f"part does not train, so its learning rate would never apply"
                + ("; with LoRA its adapters train: set lr_adapters instead" if lora else "")
                + f"; remove {prefix}lr_{p.part} or unset the flag"
            )
        if p.part == ADAPTERS and lora is False:
            raise PartLearningRateError(
                f"{prefix}lr_adapters is set, but LoRA is off: there are no adapters to train; turn LoRA on or "
                f"remove {prefix}lr_adapters"
            )
    return PartLearningRates(parts)
