"""Real Bridge Qwen3-VL models on the CPU for the memory and step-time figures (test support underneath)."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from typing import Any

FAMILY = "qwen3_vl"


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Megatron / Bridge print warnings and INFO lines on import and build; keep the table readable."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def accepted_selections(provider: Any) -> list[Any]:
    """The selections config validation accepts for this provider (no LoRA), in flag order."""
    from bridge_freeze_plugin.errors import InvalidFreezeConfigError
    from bridge_freeze_plugin.selection import FreezeSelection
    from bridge_freeze_plugin.validation import validate_selection

    accepted = []
    for selection in FreezeSelection.all_selections():
        try:
            validate_selection(selection, provider=provider)
        except InvalidFreezeConfigError:
            continue
        accepted.append(selection)
    return accepted


def label(selection: Any) -> str:
    """``full`` or the frozen parts, e.g. ``freeze LM+VM``."""
    short = {"freeze_language_model": "LM", "freeze_vision_model": "VM", "freeze_vision_projection": "VP"}
    flags = selection.set_flags()
    return "full fine-tuning" if not flags else "freeze " + "+".join(short[f] for f in flags)


def build(provider: Any, selection: Any) -> Any:
    """One bare chunk through the real provider, with the selection's flags written on the provider."""
    from bridge_freeze_testing.tiny import build_tiny_model

    for flag, value in selection.as_dict().items():
        setattr(provider, flag, value)
    with quiet():
        return build_tiny_model(FAMILY, provider)
