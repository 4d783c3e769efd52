"""The per-part report: trainable / total parameters, and which provider defaults were replaced.

:class:`FreezeReport` is the structured form (for tools and tests); :meth:`FreezeReport.format`
is the one INFO block rank 0 logs. No per-parameter lines are ever logged at INFO.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from bridge_freeze_plugin.selection import SELECTABLE_PARTS, FreezeSelection, Part

logger = logging.getLogger("bridge_freeze_plugin")


@dataclass(frozen=True)
class PartCount:
    """Parameter counts (elements, and tensors) of one part."""

    part: Part
    trainable: int
    total: int
    trainable_tensors: int
    total_tensors: int

    @property
    def frozen(self) -> int:
        return self.total - self.trainable

    @property
    def percent_trainable(self) -> float:
        return 100.0 * self.trainable / self.total if self.total else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "part": self.part.value,
            "trainable": self.trainable,
            "total": self.total,
            "trainable_tensors": self.trainable_tensors,
            "total_tensors": self.total_tensors,
            "percent_trainable": round(self.percent_trainable, 4),
        }


@dataclass(frozen=True)
class DefaultOverride:
    """A provider's declared default for a flag, replaced by the value the plugin wrote."""

    flag: str
    provider_default: bool
    value: bool

    def __str__(self) -> str:
        return f"{self.flag}={self.provider_default} replaced by {self.value}"


@dataclass(frozen=True)
class FreezeReport:
    family: str
    provider: str
    model_name: str | None
    selection: FreezeSelection
    parts: tuple[PartCount, ...]
    overridden_defaults: tuple[DefaultOverride, ...] = field(default=())

    def part(self, part: Part) -> PartCount:
        for count in self.parts:
            if count.part is part:
                return count
        return PartCount(part, 0, 0, 0, 0)

    @property
    def trainable(self) -> int:
        return sum(c.trainable for c in self.parts)

    @property
    def total(self) -> int:
        return sum(c.total for c in self.parts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "provider": self.provider,
            "model_name": self.model_name,
            "selection": self.selection.as_dict(),
            "parts": [c.as_dict() for c in self.parts],
            "trainable": self.trainable,
            "total": self.total,
            "overridden_defaults": [
                {"flag": o.flag, "provider_default": o.provider_default, "value": o.value}
                for o in self.overridden_defaults
            ],
        }

    def format(self) -> str:
        model = f" ({self.model_name})" if self.model_name else ""
        lines = [
            f"bridge-freeze: {self.provider}{model}, family {self.family}: {self.selection.describe()}",
            f"  {'part':<18} {'trainable':>14} {'total':>14} {'%':>7}",
        ]
        for count in self.parts:
            lines.append(
                f"  {count.part.value:<18} {count.trainable:>14,} {count.total:>14,} "
                f"{count.percent_trainable:>6.1f}%"
            )
        pct = 100.0 * self.trainable / self.total if self.total else 0.0
        lines.append(f"  {'total':<18} {self.trainable:>14,} {self.total:>14,} {pct:>6.1f}%")
        if self.overridden_defaults:
            lines.append(
                "  provider defaults overridden: " + ", ".join(str(o) for o in self.overridden_defaults)
            )
        return "\n".join(lines)


def ordered_parts(counts: dict[Part, PartCount]) -> tuple[PartCount, ...]:
    """The three selectable parts always; ``other`` only when the model has such parameters."""
    rows = [counts.get(p, PartCount(p, 0, 0, 0, 0)) for p in SELECTABLE_PARTS]
    if Part.OTHER in counts and counts[Part.OTHER].total_tensors:
        rows.append(counts[Part.OTHER])
    return tuple(rows)


def is_rank0() -> bool:
    """Global rank 0 (or no process group at all). Never imports torch itself."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return bool(dist.get_rank() == 0)
    return os.environ.get("RANK", "0") == "0"


def log_report(report: FreezeReport) -> None:
    if is_rank0():
        logger.info("%s", report.format())
