"""What the train / freeze patterns did in a model: per pattern what it matched, per part what they changed.

:class:`PatternTally` counts one parameter at a time (summed over ranks in a distributed build) into a
:class:`PatternSummary`; :func:`summary_lines` is the report's text of it, and :func:`check_matched` raises
:class:`UnmatchedPatternError` for a pattern that matched nothing, with the nearest real names. The patterns
themselves and their rule are in :mod:`bridge_freeze_plugin.request._patterns`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from bridge_freeze_plugin.errors import UnmatchedPatternError
from bridge_freeze_plugin.request._parts import FLAG_PARTS, SELECTABLE_PARTS, Part, spoken
from bridge_freeze_plugin.request._patterns import RULE, Pattern, PatternSet

#: How many nearest names an unmatched-pattern error lists.
SUGGESTIONS = 5


@dataclass(frozen=True)
class PatternMatch:
    """What one pattern matched in the whole model: tensors and elements of the parts, tensors of other."""

    pattern: Pattern
    tensors: int = 0
    params: int = 0
    other_tensors: int = 0


@dataclass(frozen=True)
class PartChange:
    """What the patterns changed in one part, against its flag: trained where the flag froze, and the reverse."""

    part: Part
    trained: int = 0
    trained_tensors: int = 0
    frozen: int = 0
    frozen_tensors: int = 0


@dataclass(frozen=True)
class PatternSummary:
    """Per pattern what it matched, per part what the patterns changed (model-wide in a distributed build)."""

    matches: tuple[PatternMatch, ...]
    changes: tuple[PartChange, ...]

    def unmatched(self) -> tuple[Pattern, ...]:
        return tuple(m.pattern for m in self.matches if not m.tensors)

    @property
    def parts(self) -> tuple[Part, ...]:
        """The model's parts (those the summary lists a change for)."""
        return tuple(c.part for c in self.changes)

    def change(self, part: Part) -> PartChange:
        return next((c for c in self.changes if c.part is part), PartChange(part))

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule": RULE,
            "matches": [{"kind": m.pattern.kind, "pattern": m.pattern.text, "tensors": m.tensors, "params": m.params}
                        for m in self.matches],
            "changed": {c.part.value: {"trained": c.trained, "trained_tensors": c.trained_tensors,
                                       "frozen": c.frozen, "frozen_tensors": c.frozen_tensors} for c in self.changes},
        }


class PatternTally:
    """Counts, one parameter at a time, what each pattern matches and what the patterns change per part."""

    _PART_WIDTH = 4  # trained, trained tensors, frozen, frozen tensors

    def __init__(self, patterns: PatternSet, frozen_parts: Iterable[Part], parts: Iterable[Part] | None = None) -> None:
        """``parts``: the model's parts (its family's), listed in the summary; ``None``: every part."""
        self.patterns = patterns
        self.frozen_parts = frozenset(frozen_parts)
        self.listed = SELECTABLE_PARTS if parts is None else tuple(p for p in SELECTABLE_PARTS if p in set(parts))
        n = len(patterns.all)
        self._matched = [[0, 0, 0] for _ in range(n)]  # tensors, params, other tensors
        self._parts = {part: [0] * self._PART_WIDTH for part in SELECTABLE_PARTS}

    def add(self, name: str, part: Part | None, numel: int, tensors: int = 1) -> None:
        """Count one parameter (``tensors=0``: a second shard of a tensor already counted)."""
        hits = self.patterns.hits(name)
        if part not in self._parts:
            for i in hits:
                self._matched[i][2] += tensors
            return
        for i in hits:
            self._matched[i][0] += tensors
            self._matched[i][1] += numel
        flag_trains = part not in self.frozen_parts
        if self.patterns.decide_hits(hits, flag_trains) != flag_trains:
            row = self._parts[part]  # type: ignore[index]
            offset = 0 if not flag_trains else 2
            row[offset] += numel
            row[offset + 1] += tensors

    def as_vector(self) -> list[int]:
        return [n for row in self._matched for n in row] + [n for p in SELECTABLE_PARTS for n in self._parts[p]]

    def load_vector(self, vector: Iterable[int]) -> PatternTally:
        """Replace the counts with ``vector`` (the :meth:`as_vector` of a sum over ranks); returns ``self``."""
        values = [int(v) for v in vector]
        n = len(self._matched)
        self._matched = [values[3 * i : 3 * i + 3] for i in range(n)]
        rest = values[3 * n :]
        w = self._PART_WIDTH
        self._parts = {p: rest[w * i : w * (i + 1)] for i, p in enumerate(SELECTABLE_PARTS)}
        return self

    def summary(self) -> PatternSummary:
        matches = tuple(PatternMatch(p, *row) for p, row in zip(self.patterns.all, self._matched, strict=True))
        return PatternSummary(matches, tuple(PartChange(p, *self._parts[p]) for p in self.listed))


def module_names(names: Iterable[str]) -> set[str]:
    """Every parameter name and every module name above it (what a pattern may name)."""
    out: set[str] = set()
    for name in names:
        segments = name.split(".")
        out.update(".".join(segments[:k]) for k in range(1, len(segments) + 1))
    return out


def nearest(pattern: Pattern, names: Iterable[str], k: int = SUGGESTIONS) -> list[tuple[float, str]]:
    """The ``k`` names most like the pattern's text, as (similarity, name), best first (ties by name)."""
    plain = re.sub(r"\\(.)", r"\1", pattern.text).strip("^$")
    matcher = difflib.SequenceMatcher(b=plain, autojunk=False)
    scored = []
    for name in names:
        matcher.set_seq1(name)
        scored.append((round(matcher.ratio(), 6), name))
    scored.sort(key=lambda item: (-item[0], item[1]))
    return scored[:k]


def merge_nearest(candidates: Iterable[list[tuple[float, str]]], k: int = SUGGESTIONS) -> list[str]:
    """Merge per-rank :func:`nearest` lists into the ``k`` best names overall (the same on every rank)."""
    best: dict[str, float] = {}
    for ranked in candidates:
        for score, name in ranked:
            best[name] = max(score, best.get(name, 0.0))
    return [name for name, _ in sorted(best.items(), key=lambda item: (-item[1], item[0]))[:k]]


def unmatched_error(summary: PatternSummary, where: str, suggestions: dict[str, list[str]],
                    model_wide: bool) -> UnmatchedPatternError:
    """The error for every pattern that matched nothing, with the nearest real names of each."""
    by_text = {m.pattern.text: m for m in summary.matches}
    lines = []
    for pattern in summary.unmatched():
        other = by_text[pattern.text].other_tensors
        also = f" (it matches {other} tensor(s) of 'other', which no flag or pattern touches)" if other else ""
        near = ", ".join(suggestions.get(pattern.text, [])) or "none"
        lines.append(f"{pattern.kind}_patterns entry '{pattern.text}' matches nothing{also}; nearest names: {near}")
    scope = "in the whole model (every pipeline stage and expert rank)" if model_wide else "in the model"
    unmatched = summary.unmatched()
    parts = spoken(p.value for p in summary.parts) or "any part"
    return UnmatchedPatternError(
        f"{where}: {len(unmatched)} pattern(s) match no parameter of {parts} "
        f"{scope}: " + "; ".join(lines) + ". Patterns are regular expressions matched against "
        "whole parameter or module names as 'bridge-freeze plan MODEL --json' lists them; fix or remove them.",
        [p.text for p in unmatched],
        suggestions,
    )


def check_matched(summary: PatternSummary, where: str, names: Iterable[str], gather: Any = None) -> None:
    """Raise :class:`UnmatchedPatternError` if a pattern matched nothing.

    ``names``: this rank's model-wide parameter names (for suggestions). ``gather``: ``torch.distributed``
    when the summary is model-wide over several ranks; every rank must then call this at the same point
    (they all see the same summary, so they all raise, with the same suggestions).
    """
    unmatched = summary.unmatched()
    if not unmatched:
        return
    candidates = module_names(names)
    local = {p.text: nearest(p, candidates) for p in unmatched}
    if gather is None:
        suggestions = {text: merge_nearest([ranked]) for text, ranked in local.items()}
    else:
        everyone: list[Any] = [None] * gather.get_world_size()
        gather.all_gather_object(everyone, local)
        suggestions = {p.text: merge_nearest(r[p.text] for r in everyone) for p in unmatched}
    raise unmatched_error(summary, where, suggestions, model_wide=gather is not None)


def summary_lines(summary: PatternSummary, parts: Iterable[Any], selection: Any) -> Iterator[str]:
    """The report's pattern lines: each pattern's matches, what changed per part, whole parts reversed."""
    yield f"  patterns ({RULE}):"
    for m in summary.matches:
        yield f"    {m.pattern}: {m.tensors} tensor(s), {m.params:,} parameters"
    frozen = selection.frozen_parts()
    for count in parts:
        change = summary.change(count.part) if count.part in SELECTABLE_PARTS else None
        if change is None or not (change.trained_tensors or change.frozen_tensors):
            continue
        yield (f"    changed in {count.part.value}: {change.trained:,} trained ({change.trained_tensors} tensor(s)), "
               f"{change.frozen:,} frozen ({change.frozen_tensors} tensor(s))")
        base_tensors = count.total_tensors - count.adapter_tensors
        reversed_to = "trainable" if count.part in frozen else "frozen"
        moved = change.trained_tensors if count.part in frozen else change.frozen_tensors
        if base_tensors and moved == base_tensors:
            flag = next(f for f, p in FLAG_PARTS.items() if p is count.part)
            yield (f"  note: the patterns make the whole {count.part.value} {reversed_to}, contrary to "
                   f"{flag}={count.part in frozen}")
