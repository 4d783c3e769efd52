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
    from bridge_freeze_plugin.config import validate_selection
    from bridge_freeze_plugin.errors import InvalidFreezeConfigError
    from bridge_freeze_plugin.request import FreezeSelection

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
    from bridge_freeze_harness.tiny import build_tiny_model

    for flag, value in selection.as_dict().items():
        setattr(provider, flag, value)
    with quiet():
        return build_tiny_model(FAMILY, provider)


#: Bridge LoRA for the adapters-only row: the default target modules (linear_qkv, linear_proj,
#: linear_fc1, linear_fc2), a rank that suits the tiny model's hidden size 64.
LORA_DIM = 4
LORA_ALPHA = 8


def build_lora(selection: Any, target_modules: list[str] | None = None) -> tuple[Any, dict[str, Any]]:
    """A fresh provider, ``selection``'s flags on it, Bridge's real LoRA as its pre-wrap hook; one chunk.

    Built through ``provide_distributed_model`` (no DDP wrap): that is where pre-wrap hooks run, the
    plugin's freeze first, then LoRA. A fresh provider, so the hook never reaches the other rows' builds.
    """
    from megatron.bridge.peft.lora import LoRA

    from bridge_freeze_harness.tiny import build_tiny_chunks
    from bridge_freeze_harness.train import make_provider

    with quiet():
        provider = make_provider(FAMILY)
    for flag, value in selection.as_dict().items():
        setattr(provider, flag, value)
    lora = LoRA(dim=LORA_DIM, alpha=LORA_ALPHA)
    if target_modules is not None:
        lora.target_modules = list(target_modules)
    provider.register_pre_wrap_hook(lora)
    # provide_distributed_model prints "> number of parameters on ... rank" on stdout: not in the table.
    with quiet(), contextlib.redirect_stdout(io.StringIO()):
        (chunk,) = build_tiny_chunks(FAMILY, provider)
    return chunk, {"dim": lora.dim, "alpha": lora.alpha, "target_modules": list(lora.target_modules)}
