"""Helpers the unit tests share (imported as ``from _shared import ...``; pytest puts this folder on the path).

Expected sets in tests are computed from parameter names with these, never with the plugin's own tables.
"""

from __future__ import annotations

import re

from bridge_freeze_plugin import FreezeSelection

#: Qwen3-VL's vision projection: the merger and the DeepStack mergers (read from Bridge's module tree).
QWEN3_PROJECTION = re.compile(r"^vision_model\.(merger|decoder\.deepstack_merger_list)\.")
PROJECTION_ONLY = FreezeSelection(freeze_language_model=True, freeze_vision_model=True)
#: The flags of a vision-language model (written here, not read from the vocabulary).
VLM_FLAGS = ("freeze_language_model", "freeze_vision_model", "freeze_vision_projection")


def _chunks(model):
    return model if isinstance(model, (list, tuple)) else [model]


def trainable(model) -> set[str]:
    """Names of the parameters that train, of one module or a list of chunks."""
    return {n for c in _chunks(model) for n, p in c.named_parameters() if p.requires_grad}


def names(model) -> set[str]:
    """Names of all parameters, of one module or a list of chunks."""
    return {n for c in _chunks(model) for n, _ in c.named_parameters()}


def projection_names(model) -> set[str]:
    """Qwen3-VL's projection parameters."""
    return {n for n in names(model) if QWEN3_PROJECTION.match(n)}
