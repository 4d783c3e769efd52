"""What the plugin knows of Megatron-Bridge's PEFT (LoRA) conventions, in one place.

- Bridge's LoRA wraps a target module and keeps the original as ``<target>.to_wrap``: the base
  parameter is the SAME object, only its name gains a ``to_wrap`` segment.
- Bridge's PEFT classes live under ``megatron.bridge.peft``; its pre-wrap hook is a closure made in
  ``megatron.bridge.training.setup`` (``_create_peft_pre_wrap_hook``).
"""

from __future__ import annotations

from typing import Any

#: Module names that PEFT wrappers insert in a wrapped parameter's name: ``a.linear_qkv.to_wrap.weight``
#: is the base ``a.linear_qkv.weight``.
WRAPPER_SEGMENTS = frozenset({"to_wrap"})

#: Where Bridge's PEFT code lives, and the name of the function that makes its pre-wrap hook.
_PEFT_MODULES = ("megatron.bridge.peft",)
_PEFT_HOOK_FACTORY = "_create_peft_pre_wrap_hook"


def base_name(name: str) -> str:
    """``name`` without the segments PEFT wrappers insert."""
    return ".".join(part for part in name.split(".") if part not in WRAPPER_SEGMENTS)


def hook_name(hook: Any) -> str:
    """``module.qualname`` of a hook (a function, a ``functools.partial``, or a callable object)."""
    target = getattr(hook, "func", hook)
    module = getattr(target, "__module__", None) or type(target).__module__
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}.{qualname}"


def is_peft_hook(hook: Any) -> bool:
    """Whether ``hook`` is Bridge's PEFT pre-wrap hook, or a PEFT object used as one."""
    target = getattr(hook, "func", hook)
    module = getattr(target, "__module__", None) or type(target).__module__ or ""
    if module.startswith(_PEFT_MODULES) or type(target).__module__.startswith(_PEFT_MODULES):
        return True
    return _PEFT_HOOK_FACTORY in (getattr(target, "__qualname__", "") or "")
