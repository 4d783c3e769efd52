"""A LoRA target that matches a module Bridge's LoRA cannot adapt: named, instead of Bridge's bare error.

Bridge's LoRA adapts what its targets match: a plain ``torch.nn.Linear``, or a Megatron linear layer (and a
router). Anything else a target matches (Qwen2.5-VL's patch embedding ``Conv3d``, a norm, a whole block named by
a short target such as ``visual.patch_embed``) ends in ``NotImplementedError: Layer type is unrecognized for
LoRA: <type>``, or ``AttributeError: ... has no attribute 'config'`` (Bridge reads a Megatron layer's config
first), naming neither the target nor the module. When a PEFT hook raises either in the plugin's hook chain,
:func:`unadaptable_error` walks the chunks as Bridge's PEFT does (its own ``walk`` and ``match``), asks Bridge's
own adapter check of each matched module, and raises :class:`UnadaptableLoraTargetError` naming the
targets, the modules and their types.
"""

from __future__ import annotations

from typing import Any

from bridge_freeze_plugin.errors import UnadaptableLoraTargetError, some_of
from bridge_freeze_plugin.prewrap._classify import as_chunks

__all__ = ["unadaptable_error"]

_SHOWN = 6


def _adaptable(module: Any, full_name: str) -> bool:
    """Whether Bridge's LoRA can adapt ``module`` (its own attribute reader decides; a plain Linear always)."""
    import torch

    if isinstance(module, torch.nn.Linear):
        return True
    try:
        from megatron.bridge.peft.utils import get_adapter_attributes_from_linear, is_expert_linear
    except ImportError:  # another Bridge: only a Megatron layer's name says it is linear
        return type(module).__name__.endswith(("Linear", "Router"))
    try:
        get_adapter_attributes_from_linear(module, is_expert=is_expert_linear(full_name))
    except (NotImplementedError, AttributeError):  # its type, or a module without a Megatron layer's config
        return False
    except Exception:  # noqa: BLE001 - another reason than the layer type: not what this explains
        return True
    return True


def _matched(model: Any, peft: Any) -> list[tuple[str, str, Any]]:
    """``(target, full name, module)`` of every module the PEFT object's targets match, walked as Bridge walks."""
    from megatron.bridge.peft.walk_utils import walk

    found: list[tuple[str, str, Any]] = []

    def probe(module: Any, name: str | None = None, prefix: str | None = None, **_: Any) -> Any:
        answer = peft.match(module, name, prefix)
        if answer is not None:
            target, full_name = answer
            found.append((str(target), str(full_name), module))
        return module

    for chunk in as_chunks(model):
        walk(chunk, probe)
    return found


def unadaptable_error(model: Any, peft: Any, hook_label: str, asked: str, cause: BaseException) -> BaseException:
    """The typed error for a PEFT hook's ``NotImplementedError`` / ``AttributeError`` (``cause`` itself when no
    matched module explains it)."""
    try:
        matched = _matched(model, peft)
    except Exception:  # noqa: BLE001 - the diagnosis must never hide Bridge's own error
        return cause
    bad = [(target, name, type(module).__name__) for target, name, module in matched
           if not _adaptable(module, name)]
    if not bad:
        return cause
    targets = sorted({target for target, _, _ in bad})
    modules = [f"{name} ({kind})" for _, name, kind in bad]
    return UnadaptableLoraTargetError(
        f"{asked}: LoRA target(s) {', '.join(map(repr, targets))} of pre-wrap hook {hook_label} match "
        f"{len(modules)} module(s) Bridge's LoRA cannot adapt (it adapts torch.nn.Linear and Megatron linear "
        f"layers only): {some_of(modules, _SHOWN)}. Bridge stopped with {type(cause).__name__}: {cause}. Name the "
        f"linear layers inside them instead (e.g. 'linear_qkv', 'linear_proj'), or leave these "
        f"modules out of target_modules.", modules, targets)
