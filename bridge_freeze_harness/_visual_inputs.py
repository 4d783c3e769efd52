"""Bridge's ``GenericVisualInputs`` with fields it lacks, for model inputs that vlm_step should carry.

Who imports this package, and why it is never on the plugin's runtime path: :mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def visual_inputs_with(extra: tuple[str, ...]) -> type:
    """Bridge's ``GenericVisualInputs`` with optional tensor fields ``extra`` more: vlm_step
    (``training/vlm_step.py:147-151, 286-288``) moves every field of the object to the device and passes each
    non-``None`` one the model's ``forward`` names; Bridge 0.6.2 ships no data path of its own for such a key."""
    from dataclasses import field, make_dataclass

    from megatron.bridge.training.utils.visual_inputs import GenericVisualInputs

    name = "VisualInputsWith_" + "_".join(extra)
    fields = [(key, torch.Tensor | None, field(default=None)) for key in extra]
    cls = make_dataclass(name, fields, bases=(GenericVisualInputs,))
    cls.__module__ = __name__
    return cls
