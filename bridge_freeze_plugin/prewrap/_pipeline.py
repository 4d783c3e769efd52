"""``provide()`` and ``provide_distributed_model()`` with the selection applied: the build pipeline.

Shared by the mixin (:class:`~bridge_freeze_plugin.activation.FreezableVLMProvider`) and the in-place class
patches of :mod:`~bridge_freeze_plugin.activation`. Each takes the provider and Bridge's own method.

The state of a build (which provider is being built, its :class:`~.context.BuildContext`, whether inside
Bridge's ``provide()``) is per call and per thread: two threads may build from one provider at once, and
no attribute of the provider changes while it builds (Bridge's ``provide()`` reads the flags as ``False``
through :mod:`.flags`, on the building thread only, so its own ``model.freeze()`` never runs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from bridge_freeze_plugin.errors import UnsupportedFreezeFlagError
from bridge_freeze_plugin.prewrap import _recompute_fix as recompute_fix
from bridge_freeze_plugin.prewrap._collective import errors_agreed
from bridge_freeze_plugin.prewrap._context import BuildContext
from bridge_freeze_plugin.prewrap._flags import flags_hidden
from bridge_freeze_plugin.prewrap._freeze import claim_report, freeze_chunks
from bridge_freeze_plugin.prewrap._hooks import HookChain, user_hooks
from bridge_freeze_plugin.prewrap._model_wide import store_report
from bridge_freeze_plugin.prewrap._report import log_report
from bridge_freeze_plugin.prewrap._state import provider_state
from bridge_freeze_plugin.prewrap._subclass_build import added_after_base, addition_notes, mark_additions, parameter_ids
from bridge_freeze_plugin.ranks import is_rank0
from bridge_freeze_plugin.registry import family_for_provider


@dataclass(frozen=True)
class _Call:
    context: BuildContext
    distributed: bool  # inside provide_distributed_model: errors must reach every rank
    providing: bool  # inside Bridge's provide()
    #: the parameters (ids) a base class's provide() returned inside this one (a subclass's build around it)
    base_built: list[Any] = dataclasses.field(default_factory=list, compare=False)


_LOCAL = threading.local()


def _calls() -> dict[int, _Call]:
    calls = getattr(_LOCAL, "calls", None)
    if calls is None:
        calls = _LOCAL.calls = {}
    return calls


@contextlib.contextmanager
def _entered(provider: Any, call: _Call) -> Iterator[None]:
    calls = _calls()
    outer = calls.get(id(provider))
    calls[id(provider)] = call
    try:
        yield
    finally:
        if outer is None:
            del calls[id(provider)]
        else:
            calls[id(provider)] = outer


def check_recompute(provider: Any, context: BuildContext) -> BuildContext:
    """Full recompute with a training vision side, before any model is built: fix it, or refuse it.

    With the default policy the returned context turns recompute off in the family's vision modules after
    the build (and says so in the report); with ``full_recompute_policy = "refuse"`` a flag set is an
    error here, and no flag set a warning once per provider.
    """
    granularity = getattr(provider, "recompute_granularity", None)
    if not recompute_fix.needs_fix(context.family, context.selection, granularity):
        return context
    assert context.family is not None
    if recompute_fix.policy_of(provider) == "fix":
        notes = (*context.notes, recompute_fix.note(context.family))
        return dataclasses.replace(context, notes=notes, vision_recompute_off=True)
    state = provider_state(provider)
    if context.selection.any_set or not state.recompute_warned:
        recompute_fix.refuse(context, warn_only=not context.selection.any_set, rank0=is_rank0())
        state.recompute_warned = True
    return context


#: What a build not wrapped for training is, in the report's first line.
NOT_WRAPPED = ("wrap_with_ddp=False: a checkpoint conversion, an export or an inference copy, nothing trains here; "
               "a later run may reuse what Bridge saves of this provider")
ON_META = "built on the meta device for a plan: no weights, nothing trains"
#: What a further build wrapped for training of a provider already built so is, in its report's first line.
REPEATED = ("a provider already built for training in this process (NeMo-RL's reference policy is one: built for "
            "its log-probabilities, never stepped; the first build's report is the run's)")


def untrained_kind(provider: Any, wrap_with_ddp: Any = True, meta: Any = None) -> str | None:
    """What a build is when nothing can train it (``None``: a build wrapped for training)."""
    if meta if meta is not None else getattr(provider, "init_model_with_meta_device", False):
        return ON_META
    return None if wrap_with_ddp is not False else NOT_WRAPPED


def _arguments(build: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``build``'s arguments by name, as this call gives them (only the keywords when they cannot be bound)."""
    import inspect

    try:
        return dict(inspect.signature(build).bind_partial(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        return dict(kwargs)


def repeat_kind(provider: Any, untrained: str | None) -> str | None:
    """What a build wrapped for training is when the provider already had one (``None``: its first)."""
    return REPEATED if untrained is None and provider_state(provider).training_builds else None


#: What other subsystems check before a build wrapped for training (``check(provider)`` raises to refuse it).
_TRAINING_BUILD_CHECKS: list[Callable[[Any], None]] = []


def add_training_build_check(check: Callable[[Any], None]) -> None:
    """Run ``check(provider)`` before every build that may train (not a meta or an unwrapped build); once each."""
    if check not in _TRAINING_BUILD_CHECKS:
        _TRAINING_BUILD_CHECKS.append(check)


def preflight(provider: Any, untrained: str | None = None, distributed: bool = False) -> BuildContext:
    """Everything the provider can tell before a model is built (raises before any build). ``distributed``: a
    ``provide_distributed_model`` / ``get_model`` build, which may be a further model from the provider."""
    if untrained is None:
        for check in tuple(_TRAINING_BUILD_CHECKS):
            check(provider)
    context = BuildContext.of(provider)
    repeat = repeat_kind(provider, untrained) if distributed else None
    if untrained is not None or repeat is not None:
        context = dataclasses.replace(context, untrained=untrained, repeat=repeat)
    return check_recompute(provider, context)


def provide_frozen(provider: Any, build: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``build(*args, **kwargs)`` (a Bridge ``provide``) with the selection applied to the new chunk.

    Checks the family BEFORE building; Bridge's own ``freeze()`` does not run; re-entrant (a patched
    subclass calling a patched base ``provide`` applies the selection once).
    """
    outer = _calls().get(id(provider))
    if outer is not None and outer.providing:
        model = build(*args, **kwargs)
        outer.base_built.append(parameter_ids(model))  # the family's own build, inside a subclass's provide()
        return model
    context = preflight(provider, untrained_kind(provider)) if outer is None else outer.context
    distributed = outer is not None  # then an error here must stop every rank
    call = _Call(context, distributed, providing=True)
    with _entered(provider, call), flags_hidden(provider):
        with errors_agreed(distributed):
            model = build(*args, **kwargs)
    if context.family is None or not _is_module(model, provider, context):
        return model
    with errors_agreed(distributed):
        mark_additions(provider, model, added_after_base(model, call.base_built), context)
        report, _ = freeze_chunks(model, context)
        notes = addition_notes(model, context)
        if notes:
            report = dataclasses.replace(report, notes=(*report.notes, *notes))
        if context.vision_recompute_off:
            recompute_fix.turn_off(model, context.family)
    if not distributed:  # (provide_distributed_model stores and logs the model-wide report)
        store_report(provider, report)
        if claim_report(model):
            log_report(report)
    return model


def _is_module(model: Any, provider: Any, context: BuildContext) -> bool:
    """Whether ``provide()`` returned a torch module to freeze (a test double or a lazy stand-in need not).

    With nothing asked, anything else passes through untouched, as without the plugin; with a flag or a
    pattern set, it cannot be honoured, so it raises.
    """
    import torch

    if isinstance(model, torch.nn.Module):
        return True
    if context.selection.any_set:
        raise UnsupportedFreezeFlagError(
            f"{context.asked}: {type(provider).__name__}.provide() returned a {type(model).__name__}, not a torch "
            f"module, so the selection cannot be applied to it. Build a real model, or unset the flags and patterns."
        )
    return False


def provide_distributed_frozen(provider: Any, build: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``build`` is Bridge's ``provide_distributed_model``; its pre-wrap hooks run inside the plugin's chain.

    The hooks registered with ``register_pre_wrap_hook`` (or passed as ``pre_wrap_hook=``) run as Bridge
    would run them, between the plugin's freeze (first) and the guarantee (last), before Float16Module
    and the DDP wrap.
    """
    if id(provider) in _calls():
        return build(*args, **kwargs)
    bound = _arguments(build, args, kwargs)
    context = preflight(provider, untrained_kind(provider, bound.get("wrap_with_ddp", True),
                                                 bound.get("init_model_with_meta_device")), distributed=True)
    hooks = user_hooks(provider, kwargs.pop("pre_wrap_hook", None))
    kwargs["pre_wrap_hook"] = HookChain(provider, context, hooks)
    with _entered(provider, _Call(context, distributed=True, providing=False)):
        return build(*args, **kwargs)


def get_model_frozen(build: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Bridge's public ``get_model(model_provider, ..., pre_wrap_hook=...)`` with the plugin's hook chain.

    Trainers build through it directly (NeMo-RL does), passing their own hooks: those run inside the
    plugin's :class:`HookChain` as ``provide_distributed_model`` runs them (freeze first, guarantee and the
    model-wide report last). ``get_model`` runs only the hooks it is given (``None``: none), so the chain
    holds exactly those. Called from ``provide_distributed_model`` (already inside the chain), or on a
    provider no family covers, it is Bridge's own.
    """
    import inspect

    bound = inspect.signature(build).bind(*args, **kwargs)
    provider = bound.arguments.get("model_provider", args[0] if args else None)
    if provider is None or id(provider) in _calls() or family_for_provider(provider) is None:
        return build(*args, **kwargs)
    context = preflight(provider, untrained_kind(provider, bound.arguments.get("wrap_with_ddp", True),
                                                 bound.arguments.get("init_model_with_meta_device")),
                        distributed=True)
    explicit = bound.arguments.get("pre_wrap_hook")
    hooks = user_hooks(provider, explicit) if explicit else []
    bound.arguments["pre_wrap_hook"] = HookChain(provider, context, hooks)
    with _entered(provider, _Call(context, distributed=True, providing=False)):
        return build(*bound.args, **bound.kwargs)
