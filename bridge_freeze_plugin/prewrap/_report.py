"""The per-part report: trainable / total parameters, and which provider defaults were replaced.

:class:`FreezeReport` is the structured form (for tools and tests); :meth:`FreezeReport.format`
is the one INFO block rank 0 logs. No per-parameter lines are ever logged at INFO.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bridge_freeze_plugin.prewrap._counting import PartCount
from bridge_freeze_plugin.prewrap._provider import DefaultOverride
from bridge_freeze_plugin.ranks import is_rank0
from bridge_freeze_plugin.request import INFO, FreezeSelection, Part

if TYPE_CHECKING:
    from bridge_freeze_plugin.prewrap._origins import FlagOrigin
    from bridge_freeze_plugin.request import PatternSummary

__all__ = ["DefaultOverride", "FreezeReport", "PartCount", "log_report"]

logger = logging.getLogger("bridge_freeze_plugin")


@dataclass(frozen=True)
class FreezeReport:
    family: str
    provider: str
    model_name: str | None
    selection: FreezeSelection
    parts: tuple[PartCount, ...]
    overridden_defaults: tuple[DefaultOverride, ...] = field(default=())
    #: What the build adjusted, one line each (e.g. full recompute turned off in the vision tower).
    notes: tuple[str, ...] = field(default=())
    #: With train / freeze patterns: what each matched and what they changed per part (model-wide when the
    #: report is); ``None`` without patterns.
    patterns: PatternSummary | None = field(default=None)
    #: What the build is when it is not one that trains (``None``: wrapped for training): its first line says so.
    untrained: str | None = field(default=None)
    #: What a further build wrapped for training of a provider already built so is (its first line says so)
    repeat: str | None = field(default=None)
    #: (flag, file): a flag set true whose value came from a saved config (NeMo-RL's conversion cache, a checkpoint)
    saved_flags: tuple[tuple[str, str], ...] = field(default=())
    #: where each flag of the family's parts got its value: this run's setting, the default, a saved config
    flag_origins: tuple[FlagOrigin, ...] = field(default=())

    @property
    def part_names(self) -> tuple[Part, ...]:
        """The parts this report has a row for (the family's parts), in vocabulary order."""
        return tuple(c.part for c in self.parts if c.part is not None and c.part is not Part.OTHER)

    def part(self, part: Part) -> PartCount:
        for count in self.parts:
            if count.part is part:
                return count
        return PartCount(part)

    @property
    def trainable(self) -> int:
        return sum(c.trainable for c in self.parts)

    @property
    def total(self) -> int:
        return sum(c.total for c in self.parts)

    def as_dict(self) -> dict[str, Any]:
        out = {
            "family": self.family,
            "provider": self.provider,
            "model_name": self.model_name,
            "selection": {INFO[p].flag: getattr(self.selection, INFO[p].flag) for p in self.part_names},
            "parts": [c.as_dict() for c in self.parts],
            "trainable": self.trainable,
            "total": self.total,
            "notes": list(self.notes),
            "untrained": self.untrained,
            "repeat": self.repeat,
            "saved_flags": dict(self.saved_flags),
            "flag_origins": {o.flag: o.as_dict() for o in self.flag_origins},
            "overridden_defaults": [
                {"flag": o.flag, "provider_default": o.provider_default, "value": o.value}
                for o in self.overridden_defaults
            ],
        }
        if self.patterns is not None:
            out["patterns"] = self.patterns.as_dict()
        return out

    def headline(self) -> str:
        """What trains, in the words ``check-config`` uses: the selection; with adapters, what the counts show
        (a part whose flag is false but which no full-rank parameter of trains, under plain LoRA, is not named)."""
        if not any(c.adapter_tensors for c in self.parts):
            return self.selection.describe(self.part_names)
        full = [c.part.value for c in self.parts
                if c.part is not None and c.part is not Part.OTHER and c.full_rank > 0]
        if not full:
            return "train LoRA adapters only"
        return f"train {' + '.join(full)} at full rank, and LoRA adapters"

    def format(self) -> str:
        """One block: per part trainable / total (and, with LoRA, full-rank / adapters), then the total."""
        model = f" ({self.model_name})" if self.model_name else ""
        with_adapters = any(c.adapter_tensors for c in self.parts)
        extra = f" {'full-rank':>14} {'adapters':>12}" if with_adapters else ""
        kind = (f"not a training build ({self.untrained}): " if self.untrained
                else f"another model from {self.repeat}: " if self.repeat else "")
        lines = [
            f"bridge-freeze: {kind}{self.provider}{model}, family {self.family}: {self.headline()}",
            f"  {'part':<18} {'trainable':>14}{extra} {'total':>14} {'%':>7}",
        ]
        total = PartCount(None, *(sum(col) for col in zip(*(c.as_row() for c in self.parts), strict=True)))
        for label, count in [*((c.part.value, c) for c in self.parts if c.part is not None), ("total", total)]:
            split = f" {count.full_rank:>14,} {count.adapters:>12,}" if with_adapters else ""
            lines.append(
                f"  {label:<18} {count.trainable:>14,}{split} {count.total:>14,} {count.percent_trainable:>6.1f}%"
            )
        if self.overridden_defaults:
            lines.append(
                "  provider defaults overridden: " + ", ".join(str(o) for o in self.overridden_defaults)
            )
        lines.extend(f"  {origin.line()}" for origin in self.flag_origins)
        if self.patterns is not None:
            from bridge_freeze_plugin.request import summary_lines

            lines.extend(summary_lines(self.patterns, self.parts, self.selection))
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def log_report(report: FreezeReport) -> None:
    if not is_rank0():
        return
    logger.info("%s", report.format())
    if report.saved_flags and report.untrained is None and report.repeat is None:  # said once, at the first
        files = sorted({path for _, path in report.saved_flags})
        logger.warning(
            "bridge-freeze: %s on %s: true in the saved config %s, which this run built its provider from (NeMo-RL's "
            "conversion cache, or a checkpoint's run_config.yaml); a fresh provider has false. If this run's settings "
            "did not ask for it, the saved value is in force: write the flag false, or delete / reconvert the file",
            ", ".join(f"{flag}=true" for flag, _ in report.saved_flags), report.provider, " and ".join(files))
