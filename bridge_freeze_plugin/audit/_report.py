"""The audit's verdict: what learned in the audited steps, per part, and what did not (with the cause it saw).

:class:`AuditReport` is the structured form (``as_dict()`` for tools); :meth:`AuditReport.format` is the one INFO
block rank 0 logs after the last audited step, the build report's parts with the gradient columns; each
:class:`Finding` that is warned is one WARNING line (tensor names compressed by pattern, never one line each).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from bridge_freeze_plugin.errors import some_of
from bridge_freeze_plugin.request import INFO, Part, label

#: How many names (or name patterns) a message shows.
SHOWN = 8

_NUMBER = re.compile(r"(?<=\.)\d+(?=\.|$)|(?<=^)\d+(?=\.)")

#: cause -> (what the audit saw, what to do)
CAUSES: dict[str, tuple[str, str]] = {
    "not_in_buffers": (
        "it is not in DDP's gradient buffers (made trainable after the DDP wrap), so the optimizer never updates it",
        "decide what trains before the model is wrapped: a flag, a train pattern or a pre-wrap hook",
    ),
    "no_input": (
        "no input reached it: none of the {label}'s modules ran in the audited steps{without}",
        "if the run's data has {no_media}, freeze the {label} ({flag}=True)",
    ),
    "not_run": (
        "its module never ran in the audited steps (a branch of the forward these batches did not take)",
        "check that the data exercises that branch, or freeze it with a freeze pattern if it is not meant to train",
    ),
    "recompute": (
        "full activation recompute is on for its module (recompute_granularity='full' in its config): an output the "
        "checkpointed function hands out other than through its returned tensors gets no gradient",
        "keep the plugin's fix for the family (full_recompute_policy='fix'; a family of your own declares "
        "no_full_recompute), or turn full recompute off",
    ),
    "routing": (
        "an MoE expert to which no token was routed in the audited steps",
        "nothing: it learns once tokens reach it",
    ),
    "detached": (
        "its module ran, but no gradient came back to it: its output does not reach the loss (a detach() or "
        "no_grad on that path, or an output the forward discards)",
        "look for the detach on that path, or freeze it with a freeze pattern if it is meant to stay",
    ),
}
#: Causes that are said in the block, not warned (nothing is wrong).
SAID = frozenset({"routing"})


def compress(names: Iterable[str]) -> list[str]:
    """Names with their numeric segments as ``*`` when several share the rest: ``a.*.w (3)``; sorted."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(_NUMBER.sub("*", name), []).append(name)
    return sorted(members[0] if len(members) == 1 else f"{pattern} ({len(members)})"
                  for pattern, members in groups.items())


def gib(count: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{int(count)} B"


@dataclass(frozen=True)
class PartAudit:
    """One part in the audited steps: its trainable tensors, those that got a gradient, its gradient norm per step."""

    part: Part
    trainable_tensors: int = 0
    with_gradient: int = 0
    grad_norms: tuple[float, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"part": self.part.value, "trainable_tensors": self.trainable_tensors,
                "with_gradient": self.with_gradient, "grad_norms": list(self.grad_norms)}


@dataclass(frozen=True)
class Finding:
    """Trainable tensors of one part that got no gradient in any audited step, for one cause."""

    part: Part | None
    cause: str
    names: tuple[str, ...]
    #: for ``no_input``: (gradient-buffer bytes, optimizer-state bytes) freezing the part would save
    saving: tuple[int, int] | None = None
    saving_basis: str = ""

    @property
    def warned(self) -> bool:
        return self.cause not in SAID

    def sentence(self, steps: str, model: str) -> str:
        part = self.part if self.part is not None else Part.OTHER
        info = INFO.get(part)
        media = info.media if info else ""
        fill = {"label": label(part), "flag": info.flag if info else "",
                "without": f" (batches without {media} input)" if media else "",
                "no_media": f"no {media} input" if media else f"nothing that reaches the {label(part)}"}
        seen, todo = (text.format(**fill) for text in CAUSES[self.cause])
        if self.saving is not None and info is not None:
            todo += (f": that saves {gib(self.saving[0])} of gradient buffers and {gib(self.saving[1])} of optimizer "
                     f"state ({self.saving_basis})")
        return (f"{len(self.names)} trainable tensor(s) of the {label(part)} got no gradient in optimizer "
                f"step(s) {steps} ({model}): {some_of(compress(self.names), SHOWN)}. What the audit saw: {seen}. "
                f"What to do: {todo}.")

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"part": None if self.part is None else self.part.value, "cause": self.cause,
                               "names": list(self.names), "warned": self.warned}
        if self.saving is not None:
            out["saving_bytes"] = {"gradient_buffers": self.saving[0], "optimizer_state": self.saving[1]}
        return out


@dataclass(frozen=True)
class AuditReport:
    """What the run-time audit found in the first ``steps`` optimizer steps of one model (the same on every rank)."""

    provider: str
    family: str
    model_name: str | None
    steps: int
    parts: tuple[PartAudit, ...]
    findings: tuple[Finding, ...] = ()
    #: the model-wide names of the trainable tensors that got a non-zero gradient in some audited step
    learned: tuple[str, ...] = ()
    #: frozen (and learning-rate-0) tensors and persistent buffers held unchanged, and through which optimizer step
    held_tensors: int = 0
    held_buffers: int = 0
    held_through: int = 0
    zero_lr_parts: tuple[str, ...] = ()
    strict: bool = False
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """Every trainable tensor got a gradient (experts no token reached aside)."""
        return not any(f.warned for f in self.findings)

    @property
    def step_range(self) -> str:
        return "1" if self.steps == 1 else f"1-{self.steps}"

    @property
    def model(self) -> str:
        name = f" ({self.model_name})" if self.model_name else ""
        return f"{self.provider}{name}, family {self.family}"

    def part(self, part: Part) -> PartAudit:
        return next((p for p in self.parts if p.part is part), PartAudit(part))

    def warnings(self) -> list[str]:
        return [f"bridge-freeze audit: {f.sentence(self.step_range, self.model)}" for f in self.findings if f.warned]

    def as_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider, "family": self.family, "model_name": self.model_name, "steps": self.steps,
            "ok": self.ok, "strict": self.strict, "parts": [p.as_dict() for p in self.parts],
            "findings": [f.as_dict() for f in self.findings], "learned": list(self.learned),
            "held": {"tensors": self.held_tensors, "buffers": self.held_buffers, "through_step": self.held_through},
            "zero_lr_parts": list(self.zero_lr_parts), "seconds": round(self.seconds, 4), "notes": list(self.notes),
        }

    def format(self) -> str:
        """The INFO block: per part trainable tensors / those with a gradient / the largest gradient norm."""
        lines = [f"bridge-freeze audit: {self.model}, optimizer step(s) {self.step_range}: what learned",
                 f"  {'part':<18} {'trainable tensors':>18} {'with a gradient':>16} {'grad norm (max)':>16}"]
        for row in self.parts:
            norm = f"{max(row.grad_norms):.3e}" if row.trainable_tensors and row.grad_norms else "-"
            got = f"{row.with_gradient:,}" if row.trainable_tensors else "-"
            lines.append(f"  {row.part.value:<18} {row.trainable_tensors:>18,} {got:>16} {norm:>16}")
        trainable = sum(p.trainable_tensors for p in self.parts)
        lines.append(f"  {'total':<18} {trainable:>18,} {sum(p.with_gradient for p in self.parts):>16,}")
        through = (f"through optimizer step {self.held_through}" if self.held_through
                   else f"through the forward and backward of step {self.steps} (no optimizer step yet)")
        lines.append(f"  held (frozen, or at learning rate 0): {self.held_tensors:,} tensor(s) and "
                     f"{self.held_buffers:,} buffer(s) unchanged {through}, no frozen one with a gradient; checked "
                     f"once more after optimizer step {self.steps}")
        missing = sum(len(f.names) for f in self.findings if f.warned)
        aside = " (but MoE experts no token reached)" if any(not f.warned for f in self.findings) else ""
        lines.append(f"  every trainable tensor got a gradient{aside}: OK" if not missing else
                     f"  {missing} trainable tensor(s) got no gradient in any audited step (see the warnings)")
        for part in self.zero_lr_parts:
            lines.append(f"  note: {part} trains at learning rate 0: it gets gradients and stays as it is (held above)")
        for finding in self.findings:
            if not finding.warned:
                lines.append(f"  note: {len(finding.names)} tensor(s) of the {label(finding.part or Part.OTHER)}: "
                             f"{CAUSES[finding.cause][0]} ({some_of(compress(finding.names), 3)})")
        lines.extend(f"  note: {note}" for note in self.notes)
        lines.append(f"  audit cost: {self.seconds:.3f} s over {self.steps} step(s); off from here on")
        return "\n".join(lines)
