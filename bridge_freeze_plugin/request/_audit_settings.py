"""What the run-time audit is asked to do: how many optimizer steps it audits, and whether a finding raises.

Two provider fields (real dataclass fields on every patched provider, so they travel in ``run_config.yaml``) and
two environment variables, which win over the fields (an operator turns the audit off, or strict, without
touching the config):

- ``audit_steps`` / ``BRIDGE_FREEZE_AUDIT_STEPS``: the first N optimizer steps are audited (default
  :data:`DEFAULT_STEPS`); ``0`` turns the audit off;
- ``audit_strict`` / ``BRIDGE_FREEZE_AUDIT_STRICT``: a trainable tensor that got no gradient in any audited step
  raises :class:`~bridge_freeze_plugin.errors.TrainingAuditError` on every rank instead of a warning.

Read once per build, before any model is built, so a malformed value fails there. Pure: no torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from bridge_freeze_plugin.errors import InvalidFreezeConfigError

ENV_STEPS = "BRIDGE_FREEZE_AUDIT_STEPS"
ENV_STRICT = "BRIDGE_FREEZE_AUDIT_STRICT"
#: The provider fields.
STEPS_FIELD = "audit_steps"
STRICT_FIELD = "audit_strict"
#: Optimizer steps audited by default: more than one, so that a batch without images (or audio) is no false alarm.
DEFAULT_STEPS = 3
#: How the strict variable is read (case and surrounding spaces ignored).
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class AuditSettings:
    """The audit of one build: ``steps`` optimizer steps (0: off), ``strict`` raising instead of warning."""

    steps: int = DEFAULT_STEPS
    strict: bool = False
    #: where ``steps`` came from: ``"default"``, ``"audit_steps"`` or ``BRIDGE_FREEZE_AUDIT_STEPS``
    steps_source: str = "default"

    @property
    def on(self) -> bool:
        return self.steps > 0

    def describe(self) -> str:
        if not self.on:
            return f"the run-time audit is off ({self.steps_source}=0)"
        return f"the run-time audit covers the first {self.steps} optimizer step(s){' (strict)' if self.strict else ''}"


def _steps(value: Any, where: str, label: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidFreezeConfigError(
            f"{where}={value!r} on {label}: the number of optimizer steps the run-time audit covers must be a whole "
            f"number, 0 or more (0 turns the audit off; default {DEFAULT_STEPS}). Write e.g. {where}={DEFAULT_STEPS}."
        )
    return value


def _env_steps(raw: str, label: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidFreezeConfigError(
            f"{ENV_STEPS}={raw!r} (building {label}): the number of optimizer steps the run-time audit covers must "
            f"be a whole number, 0 or more (0 turns the audit off). Set it to e.g. {DEFAULT_STEPS}, or unset it."
        )
    return value


def _env_strict(raw: str, label: str) -> bool:
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise InvalidFreezeConfigError(
        f"{ENV_STRICT}={raw!r} (building {label}) is not a boolean: write one of {', '.join(TRUE_WORDS)} for a "
        f"strict audit, or one of 0, false, no, off (or unset it)."
    )


def audit_settings(source: Any, label: str = "the model") -> AuditSettings:
    """The audit settings of ``source`` (a provider, or any object with the fields; absent fields: defaults) and
    the environment. Raises :class:`InvalidFreezeConfigError` naming the field or variable on a malformed value."""
    steps = _steps(getattr(source, STEPS_FIELD, DEFAULT_STEPS), STEPS_FIELD, label)
    origin = STEPS_FIELD if steps != DEFAULT_STEPS else "default"
    raw = os.environ.get(ENV_STEPS)
    if raw is not None and raw.strip():
        steps, origin = _env_steps(raw, label), ENV_STEPS
    strict = getattr(source, STRICT_FIELD, False)
    if not isinstance(strict, bool):
        raise InvalidFreezeConfigError(
            f"{STRICT_FIELD}={strict!r} on {label} must be True or False (True: a trainable tensor that got no "
            f"gradient in the audited steps raises instead of a warning)."
        )
    raw_strict = os.environ.get(ENV_STRICT)
    if raw_strict is not None and raw_strict.strip():
        strict = _env_strict(raw_strict, label)
    return AuditSettings(steps=steps, strict=strict, steps_source=origin)
