"""Which tiny configurations ``bridge-freeze demo`` runs here, and why not the others: no model code imported.

A refusal is given before anything is imported or written (the command answers in a fraction of a second), so
everything here is read from the family modules' sources (:mod:`bridge_freeze_harness.tiny._index`): their
``NO_HF_CHECKPOINT`` reasons, their ``TRAIN_SPECS`` / ``CANNOT_TRAIN``. The flow itself:
:mod:`bridge_freeze_harness.demo_flow`. Who imports this package, and why: :mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

from bridge_freeze_harness.tiny import TINY_FAMILIES
from bridge_freeze_harness.tiny._index import Declared, cannot_train_reason

__all__ = ["DEMO_CANNOT_RUN", "demo_families", "demo_refusal"]

#: family -> why the real-loop demo cannot run it here although it has an HF checkpoint recipe and trains (measured
#: on this machine; one line each).
DEMO_CANNOT_RUN: dict[str, str] = {}


def demo_refusal(family: str) -> str | None:
    """Why ``family`` cannot run :func:`~bridge_freeze_harness.demo_flow.run_demo_flow` here, or ``None``."""
    if family not in TINY_FAMILIES:
        return "no tiny configuration of that name"
    no_checkpoint = Declared("NO_HF_CHECKPOINT")
    if family in no_checkpoint:
        return str(no_checkpoint[family])
    return cannot_train_reason(family) or DEMO_CANNOT_RUN.get(family)


def demo_families() -> list[str]:
    """The families :func:`~bridge_freeze_harness.demo_flow.run_demo_flow` runs, sorted."""
    return sorted(name for name in TINY_FAMILIES if demo_refusal(name) is None)
