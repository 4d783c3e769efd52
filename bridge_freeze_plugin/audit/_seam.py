"""Where the run-time audit meets a training step: megatron-core's ``finalize_model_grads``, once it returns.

Every Megatron trainer ends a step's backward with megatron-core's ``finalize_model_grads(model, num_tokens, ...)``
(``megatron.core.distributed.finalize_model_grads``): Bridge's ``train()`` through ``config.finalize_model_grads_func``
(a ``partial`` of it) that the pipeline schedules call; NeMo-RL's Megatron policy worker by calling that saved
function itself after its schedules; SkyRL 0.4.0 from its ``optim_step`` (its schedules get a no-op, and it runs
Bridge's ``finalize_model_grads_with_expert_adapter_sync``, which calls it); a user's loop with
``get_forward_backward_func()`` through the config attribute. When it returns, the step's gradients are final and
the optimizer has not stepped yet: the audit's moment. A trainer that reduces gradients with code of its own calls
:func:`~bridge_freeze_plugin.audit.audit_step` there instead.

So the plugin replaces that one function, in its module and wherever it is already bound by name (a module that
imported it before the plugin activated), with a wrapper that keeps everything the function had (``functools.wraps``:
name, docstring, ``__wrapped__``, signature). With no audit pending the wrapper's whole cost is one test of an empty
dict. Each replaced binding is recorded for ``deactivate()``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from bridge_freeze_plugin.audit import _run
from bridge_freeze_plugin.prewrap import STATE, keeps

#: The module that defines the function, and its name there.
FINALIZE = ("megatron.core.distributed.finalize_model_grads", "finalize_model_grads")


def audit_step(model: Any) -> None:
    """Audit the step whose gradients are now final (a trainer's own gradient reduction calls this after it, on
    every rank, once per optimizer step). Does nothing for a model without a pending audit."""
    audit = _run.audit_of(model)
    if audit is not None:
        audit.after_finalize(model if isinstance(model, list | tuple) else [model])


def audited(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (megatron-core's ``finalize_model_grads``), then :func:`audit_step` on its model."""

    @keeps(original)
    def finalize_model_grads(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if _run.PENDING:
            model = args[0] if args else kwargs.get("model")
            if model is not None:
                audit_step(model)
        return result

    return finalize_model_grads


def install(module: ModuleType) -> None:
    """Replace ``finalize_model_grads`` in its module (just imported, or imported long ago) and in every loaded
    module that holds the same function under that name."""
    name = FINALIZE[1]
    original = module.__dict__.get(name)
    if not STATE.active or not callable(original) or hasattr(original, "__bridge_freeze_wrapped__"):
        return
    wrapper = audited(original)
    with STATE.lock:
        for holder in [module, *(m for m in list(sys.modules.values()) if m is not module)]:
            namespace = getattr(holder, "__dict__", None)
            if isinstance(namespace, dict) and namespace.get(name) is original:
                STATE.guarded.setdefault(holder, {})[name] = original  # type: ignore[index]
                setattr(holder, name, wrapper)
