"""LoRA targets as the trainer's worker hands them to Bridge: its own names replaced by Megatron leaf names.

SkyRL's Megatron worker never gives Bridge's LoRA the string ``"all-linear"`` (its default ``target_modules``): it
writes its list of Megatron leaf names in its place (the layout's ``lora.target_aliases``). With
``lora_type: canonical_lora`` Bridge's ``CanonicalLoRA`` takes split names (``linear_q``, ``linear_fc1_up``...), each
put on the fused module it splits: read here as that module's leaf name, which is what the rules match.
"""

from __future__ import annotations

from typing import Any

from bridge_freeze_plugin.config._layout_records import LoraKeys
from bridge_freeze_plugin.config._values import select

#: Bridge's ``CanonicalLoRA``: a split name -> the leaf name of the fused Megatron module it lands on.
CANONICAL_MODULES = {"linear_q": "linear_qkv", "linear_k": "linear_qkv", "linear_v": "linear_qkv",
                     "linear_fc1_up": "linear_fc1", "linear_fc1_gate": "linear_fc1"}


def trainer_targets(cfg: Any, keys: LoraKeys, target: str | list[str] | None) -> str | list[str] | None:
    """``target_modules`` as Bridge's LoRA receives it in this layout's runs (unchanged where the layout's trainer
    passes it through)."""
    if target is None:
        target = keys.default_target
    if isinstance(target, str) and target in keys.target_aliases:
        target = list(keys.target_aliases[target])
    if keys.type is not None and select(cfg, keys.type) == "canonical_lora" and target:
        names = [target] if isinstance(target, str) else target
        target = list(dict.fromkeys(CANONICAL_MODULES.get(name, name) for name in names))
    return target
