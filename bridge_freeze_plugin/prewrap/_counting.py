"""Per-part counting: trainable / total parameters and tensors, each tensor counted once.

The one tally behind the freeze report, the model-wide (distributed) report, ``bridge-freeze plan`` and
``bridge-freeze demo``. Imports nothing heavy: it only asks a parameter for ``numel()`` and
``requires_grad``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bridge_freeze_plugin.request import INFO, SELECTABLE_PARTS, Part

#: The order of the numbers in :meth:`PartCount.as_row` / :meth:`PartTally.as_vector`.
ROW_FIELDS: tuple[str, ...] = (
    "trainable", "total", "trainable_tensors", "total_tensors", "adapters", "adapter_tensors",
)


@dataclass(frozen=True)
class PartCount:
    """Parameter counts (elements, and tensors) of one part (``part=None``: the whole model).

    ``trainable`` counts every trainable parameter; ``adapters`` the trainable ones a hook added (LoRA's
    adapters), so ``full_rank`` = ``trainable`` - ``adapters`` trains at full rank.
    """

    part: Part | None
    trainable: int = 0
    total: int = 0
    trainable_tensors: int = 0
    total_tensors: int = 0
    adapters: int = 0
    adapter_tensors: int = 0

    @property
    def frozen(self) -> int:
        return self.total - self.trainable

    @property
    def full_rank(self) -> int:
        return self.trainable - self.adapters

    @property
    def percent_trainable(self) -> float:
        return 100.0 * self.trainable / self.total if self.total else 0.0

    def as_row(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name in ROW_FIELDS)

    def as_dict(self) -> dict[str, Any]:
        """The counts by name; ``adapters`` / ``adapter_tensors`` only when a hook added adapters."""
        out: dict[str, Any] = {} if self.part is None else {"part": self.part.value}
        out.update(zip(ROW_FIELDS, self.as_row(), strict=True))
        if not self.adapter_tensors:
            del out["adapters"], out["adapter_tensors"]
        out["percent_trainable"] = round(self.percent_trainable, 4)
        return out


class PartTally:
    """Accumulates counts per part; :meth:`add` one tensor (or a share of one) at a time."""

    def __init__(self) -> None:
        self._rows: dict[Part, list[int]] = {}

    def add(self, part: Part | None, numel: int, trainable: bool, tensors: int = 1, adapter: bool = False) -> None:
        """Count ``numel`` elements in ``part`` (``None``: under no prefix, counted as ``other``).

        ``tensors`` is how many model tensors this is (0 for a second shard of a tensor already counted);
        ``adapter``: a trainable parameter a hook added (not a base weight).
        """
        row = self._rows.setdefault(Part.OTHER if part is None else part, [0] * len(ROW_FIELDS))
        row[1] += numel
        row[3] += tensors
        if trainable:
            row[0] += numel
            row[2] += tensors
            if adapter:
                row[4] += numel
                row[5] += tensors

    def count(self, part: Part) -> PartCount:
        return PartCount(part, *self._rows.get(part, [0] * len(ROW_FIELDS)))

    def parts(self, listed: Iterable[Part] | None = None) -> tuple[PartCount, ...]:
        """A row for each part that has tensors, and for each of ``listed`` (the family's parts; ``None``: every
        part) that a vision-language model always has (an audio part the model was built without has no row);
        ``other`` only when the model has such tensors."""
        keep = set(SELECTABLE_PARTS if listed is None else listed)
        rows = [self.count(p) for p in SELECTABLE_PARTS
                if p in self._rows or (p in keep and INFO[p].assumed)]
        other = self.count(Part.OTHER)
        if other.total_tensors:
            rows.append(other)
        return tuple(rows)

    def total(self) -> PartCount:
        sums = [sum(row[i] for row in self._rows.values()) for i in range(len(ROW_FIELDS))]
        return PartCount(None, *sums)

    def as_vector(self) -> list[int]:
        """Every part's row, in :class:`Part` order (for an ``all_reduce``)."""
        return [n for part in Part for n in self._rows.get(part, [0] * len(ROW_FIELDS))]

    @classmethod
    def from_vector(cls, vector: Iterable[int]) -> PartTally:
        values = list(vector)
        width = len(ROW_FIELDS)
        tally = cls()
        for i, part in enumerate(Part):
            row = [int(v) for v in values[i * width : (i + 1) * width]]
            if any(row):
                tally._rows[part] = row
        return tally

    @classmethod
    def from_counts(cls, counts: Mapping[Part, PartCount]) -> PartTally:
        tally = cls()
        for part, count in counts.items():
            tally._rows[part] = list(count.as_row())
        return tally


def tally_parameters(classified: Iterable[tuple[Part | None, Any]]) -> PartTally:
    """Tally ``(part, parameter)`` pairs as they are now; a tensor shared between modules counts once."""
    tally = PartTally()
    seen: set[int] = set()
    for part, param in classified:
        if id(param) in seen:
            continue
        seen.add(id(param))
        tally.add(part, int(param.numel()), bool(param.requires_grad))
    return tally
