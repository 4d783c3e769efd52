"""``FreezableVLMProvider``: the provider override and pre-wrap freeze for any Bridge VLM provider.

Put the mixin first among the bases of a Bridge provider dataclass::

    @dataclass
    class MyQwen(FreezableVLMProvider, Qwen3VLMoEModelProvider):
        pass

    provider = MyQwen(..., freeze_vision_model=True)   # everything but the vision encoder trains

or turn an existing provider (e.g. from ``AutoBridge.to_megatron_provider()``) into one with
:func:`make_freezable`, which also writes a selection to it.

What the mixin does:

- gives the provider the three ``freeze_*`` fields, defaulting to ``False`` (replacing any provider
  default: Bridge's ``Qwen3VLMoEModelProvider`` freezes LM and vision encoder by default);
- in ``provide()``: refuses a flag on a provider whose family is not registered, and a trained
  Qwen3-VL-family projection under full recompute (validation rule 7), BEFORE building;
  keeps Bridge's own ``model.freeze()`` from running (its gaps and per-rank prints), and applies the
  selection by registry prefix to the new chunk;
- in ``provide_distributed_model()``: adds a pre-wrap hook, first in the chain, that (re)applies the
  selection to all chunks and logs the per-part report once on rank 0, before Float16Module and DDP.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Iterator
from typing import Any

from bridge_freeze_plugin.distributed import collective_hook, errors_agreed, model_wide_report, store_report
from bridge_freeze_plugin.errors import UnsupportedFreezeFlagError
from bridge_freeze_plugin.freeze import apply_selection, claim_report, count_parts
from bridge_freeze_plugin.guarantee import GuardedHookChain
from bridge_freeze_plugin.recompute import check_projection_recompute
from bridge_freeze_plugin.registry import FamilySpec, class_path, family_for_provider, list_families
from bridge_freeze_plugin.report import DefaultOverride, FreezeReport, is_rank0, log_report
from bridge_freeze_plugin.selection import FLAGS, FreezeSelection

ModelChunks = list[Any]


# --------------------------------------------------------------------------------------------
# Provider override: the flags are always written; the config is the only source of truth.
# --------------------------------------------------------------------------------------------


def _is_plugin_class(cls: type) -> bool:
    return cls is FreezableVLMProvider or cls.__dict__.get("_bridge_freeze_generated", False)


#: (class, flag) -> the default a provider class declared before activation patched it to False.
ORIGINAL_DEFAULTS: dict[tuple[type, str], bool] = {}


def declared_default(cls: type, flag: str) -> bool | None:
    """The default the provider class itself declares for ``flag`` (ignoring this plugin's mixin).

    ``None`` when no class in its hierarchy declares the flag (the plugin added it).
    """
    for klass in cls.__mro__:
        if _is_plugin_class(klass):
            continue
        if (klass, flag) in ORIGINAL_DEFAULTS:
            return ORIGINAL_DEFAULTS[(klass, flag)]
        if flag in inspect.get_annotations(klass):
            fields = getattr(klass, "__dataclass_fields__", {})
            fld = fields.get(flag)
            if fld is not None and fld.default is not dataclasses.MISSING:
                return bool(fld.default)
            default = klass.__dict__.get(flag, False)
            return bool(default) if isinstance(default, bool) else False
    return None


def overridden_defaults(provider: Any) -> tuple[DefaultOverride, ...]:
    """Provider defaults that would have frozen a part which, by the written config, now trains.

    (A flag the config sets to ``True`` on a provider that defaults to ``False`` is a request, shown
    in the selection itself, not an override to warn about.)
    """
    overrides = []
    for flag in FLAGS:
        default = declared_default(type(provider), flag)
        value = bool(getattr(provider, flag, False))
        if default is True and value is False:
            overrides.append(DefaultOverride(flag, default, value))
    return tuple(overrides)


def write_selection(provider: Any, selection: FreezeSelection) -> None:
    """Write all three flags to the provider, whether they are set or not."""
    for flag, value in selection.as_dict().items():
        setattr(provider, flag, value)


def model_name_of(provider: Any) -> str | None:
    for attr in ("hf_model_id", "hf_model_name", "name_or_path", "_name_or_path"):
        value = getattr(provider, attr, None)
        if isinstance(value, str) and value:
            return value
    return None


def provider_label(provider: Any) -> str:
    base = next((k for k in type(provider).__mro__ if not _is_plugin_class(k)), type(provider))
    return base.__name__


def resolve_family(provider: Any, selection: FreezeSelection | None = None) -> FamilySpec | None:
    """The provider's family; raises if a flag is set and the family is unknown (before any build)."""
    selection = FreezeSelection.from_object(provider) if selection is None else selection
    family = family_for_provider(provider)
    if family is None and selection.any_set:
        model = model_name_of(provider)
        supported = ", ".join(f"{f.name} ({', '.join(p.rpartition(':')[2] for p in f.providers)})"
                              for f in list_families())
        raise UnsupportedFreezeFlagError(
            f"{', '.join(f'{f}=True' for f in selection.set_flags())} was set on "
            f"{class_path(type(provider)).replace(':', '.')}{f' (model {model})' if model else ''}, "
            f"but no bridge-freeze family covers this provider, so the flag cannot be honoured. "
            f"Supported families: {supported}. Unset the flag, or register this model's family with "
            f"bridge_freeze_plugin.register_family(...)."
        )
    return family


_RECOMPUTE_WARNED = "_bridge_freeze_recompute_warned"


def check_recompute(provider: Any, family: FamilySpec | None, selection: FreezeSelection) -> None:
    """Validation rule 7 on the provider's own ``recompute_granularity``, before any model is built.

    Raises :class:`~bridge_freeze_plugin.errors.InvalidFreezeConfigError` when a flag is set and the
    projection would train under full recompute on an affected family; with no flag set, warns once per
    provider (global rank 0), never fails.
    """
    value = getattr(provider, "recompute_granularity", None)
    model = model_name_of(provider)
    asked = (f"{', '.join(f'{f}=True' for f in selection.set_flags())} on {provider_label(provider)}"
             f"{f' (model {model})' if model else ''}")
    warned = provider.__dict__.get(_RECOMPUTE_WARNED, False)
    if check_projection_recompute(
        family, selection, {"recompute_granularity": value}, asked=asked,
        turn_off="recompute_granularity=None", freeze_projection="freeze_vision_projection=True",
        warn=not warned and is_rank0(),
    ):
        provider.__dict__[_RECOMPUTE_WARNED] = True


def check_before_build(provider: Any, selection: FreezeSelection | None = None) -> FamilySpec | None:
    """Everything the provider can tell before a model is built: its family (rule 5) and rule 7."""
    selection = FreezeSelection.from_object(provider) if selection is None else selection
    family = resolve_family(provider, selection)
    check_recompute(provider, family, selection)
    return family


@contextlib.contextmanager
def bridge_freeze_suspended(provider: Any) -> Iterator[None]:
    """Hide the flags from Bridge's own ``provide()`` so its ``model.freeze()`` does not run.

    Bridge's per-family freeze() methods leave parts of some vision towers to no flag, and
    Nemotron-VL's prints one line per parameter on every rank; the plugin's own freeze replaces it.
    """
    saved = {flag: getattr(provider, flag) for flag in FLAGS if hasattr(provider, flag)}
    for flag in saved:
        object.__setattr__(provider, flag, False)
    try:
        yield
    finally:
        for flag, value in saved.items():
            object.__setattr__(provider, flag, value)


def _apply(provider: Any, model: Any, family: FamilySpec, selection: FreezeSelection) -> FreezeReport:
    return apply_selection(
        model,
        family,
        selection,
        provider_name=provider_label(provider),
        model_name=model_name_of(provider),
        overridden_defaults=overridden_defaults(provider),
    )


# --------------------------------------------------------------------------------------------
# Building: shared by the mixin and by the activation's in-place class patches.
# --------------------------------------------------------------------------------------------

_DEPTH = "_bridge_freeze_depth"
_IN_DISTRIBUTED = "_bridge_freeze_in_distributed"


def freeze_context(provider: Any) -> tuple[FamilySpec, FreezeSelection, str] | None:
    selection = FreezeSelection.from_object(provider)
    family = resolve_family(provider, selection)
    return None if family is None else (family, selection, provider_label(provider))


def provide_frozen(provider: Any, build: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``build(*args, **kwargs)`` (a Bridge ``provide``) with the selection applied to the new chunk.

    Checks the family BEFORE building; hides the flags from Bridge's own ``freeze()``; re-entrant
    (a patched subclass calling a patched base ``provide`` applies the selection once).
    """
    state = provider.__dict__
    if state.get(_DEPTH, 0):
        return build(*args, **kwargs)
    selection = FreezeSelection.from_object(provider)
    family = check_before_build(provider, selection)  # fails before any model is built
    distributed = state.get(_IN_DISTRIBUTED, False)  # then an error here must stop every rank
    state[_DEPTH] = 1
    try:
        with bridge_freeze_suspended(provider), errors_agreed(distributed):
            model = build(*args, **kwargs)
    finally:
        state[_DEPTH] = 0
    if family is not None:
        with errors_agreed(distributed):
            report = _apply(provider, model, family, selection)
        if not distributed:  # (provide_distributed_model stores and logs the model-wide report)
            store_report(provider, report)
            if claim_report(model):
                log_report(report)
    return model


class ApplySelectionHook:
    """The provider's pre-wrap freeze hook. An object, not a closure, so that a deep-copied or pickled
    provider gets a hook bound to itself rather than to the original."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider

    def __call__(self, model: ModelChunks) -> ModelChunks:
        ctx = freeze_context(self.provider)
        if ctx is not None:
            _apply(self.provider, model, ctx[0], ctx[1])
        return model

    def __repr__(self) -> str:
        return f"<bridge-freeze pre-wrap hook of {provider_label(self.provider)}>"


def apply_hook(provider: Any) -> ApplySelectionHook:
    """The provider's pre-wrap freeze hook (one per provider)."""
    hook = provider.__dict__.get("_bridge_freeze_hook")
    if not isinstance(hook, ApplySelectionHook) or hook.provider is not provider:
        hook = provider.__dict__["_bridge_freeze_hook"] = ApplySelectionHook(provider)
    return hook


def _log_final_report(provider: Any, model: ModelChunks) -> None:
    ctx = freeze_context(provider)
    if ctx is not None and claim_report(model):
        local = count_parts(
            model, ctx[0], ctx[1], provider_name=ctx[2], model_name=model_name_of(provider),
            overridden_defaults=overridden_defaults(provider),
        )
        report = model_wide_report(model, local, ctx[0])  # collective: summed over TP/PP, not DP
        store_report(provider, report)
        log_report(report)


def provide_distributed_frozen(provider: Any, build: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``build`` is Bridge's ``provide_distributed_model``; runs its pre-wrap hooks under the guarantee.

    The hooks registered with ``register_pre_wrap_hook`` (or passed as ``pre_wrap_hook=``) run as
    Bridge would run them, between the plugin's freeze (first) and the guarantee check (last), so
    the freeze happens before Float16Module and the DDP wrap and nothing after it can silently undo it.
    """
    state = provider.__dict__
    if state.get(_IN_DISTRIBUTED, False):
        return build(*args, **kwargs)
    check_before_build(provider)  # fails before any model is built
    explicit = kwargs.pop("pre_wrap_hook", None)
    if explicit is None:
        hooks = list(getattr(provider, "_pre_wrap_hooks", None) or [])
    else:
        hooks = list(explicit) if isinstance(explicit, (list, tuple)) else [explicit]
    ours = apply_hook(provider)
    hooks = [h for h in hooks if h is not ours]
    kwargs["pre_wrap_hook"] = collective_hook(  # an error on any rank raises on every rank
        GuardedHookChain(ours, hooks, lambda: freeze_context(provider)),
        after=lambda model: _log_final_report(provider, model),
    )
    state[_IN_DISTRIBUTED] = True
    try:
        return build(*args, **kwargs)
    finally:
        state[_IN_DISTRIBUTED] = False


# --------------------------------------------------------------------------------------------
# The mixin.
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class FreezableVLMProvider:
    """Mixin for Bridge VLM providers: exactly the selected parts train, or a clear error."""

    freeze_language_model: bool = False
    freeze_vision_model: bool = False
    freeze_vision_projection: bool = False

    @property
    def freeze_selection(self) -> FreezeSelection:
        return FreezeSelection.from_object(self)

    def set_freeze_selection(self, selection: FreezeSelection) -> None:
        write_selection(self, selection)

    def freeze_family(self) -> FamilySpec | None:
        """The registry family of this provider (raises if a flag is set and there is none)."""
        return resolve_family(self)

    def freeze_report(self, model: Any) -> FreezeReport | None:
        """The report for ``model`` (chunks or one module); applies the selection first (idempotent)."""
        family = resolve_family(self)
        return None if family is None else _apply(self, model, family, self.freeze_selection)

    def bridge_freeze_pre_wrap_hook(self, model: ModelChunks) -> ModelChunks:
        """Apply the selection to every chunk and log the report once (usable as a pre-wrap hook)."""
        apply_hook(self)(model)
        _log_final_report(self, model)
        return model

    def provide(
        self, pre_process: bool | None = None, post_process: bool | None = None, vp_stage: int | None = None
    ) -> Any:
        return provide_frozen(self, super().provide, pre_process, post_process, vp_stage)  # type: ignore[misc]

    def provide_distributed_model(self, *args: Any, **kwargs: Any) -> list[Any]:
        return provide_distributed_frozen(self, super().provide_distributed_model, *args, **kwargs)  # type: ignore[misc]


# --------------------------------------------------------------------------------------------
# Existing providers.
# --------------------------------------------------------------------------------------------

_GENERATED: dict[type, type] = {}


def freezable_class(cls: type) -> type:
    """The (cached) dataclass ``FreezableVLMProvider`` subclass of a provider class."""
    if issubclass(cls, FreezableVLMProvider):
        return cls
    generated = _GENERATED.get(cls)
    if generated is None:
        namespace = {"__module__": cls.__module__, "_bridge_freeze_generated": True,
                     "__doc__": f"{cls.__name__} with bridge-freeze-plugin's FreezableVLMProvider."}
        generated = dataclasses.dataclass(type(cls.__name__, (FreezableVLMProvider, cls), namespace))
        generated.__qualname__ = cls.__qualname__ + ".__bridge_freeze__"
        _GENERATED[cls] = generated
    return generated


def make_freezable(provider: Any, selection: FreezeSelection | None = None) -> Any:
    """Make an existing provider freezable in place and write ``selection`` (default: train all).

    The provider keeps its class's behaviour and ``isinstance`` relations; its class becomes the
    freezable subclass. Raises :class:`UnsupportedFreezeFlagError` at once if ``selection`` sets a
    flag and the provider's family is not registered.
    """
    selection = FreezeSelection() if selection is None else selection
    resolve_family(provider, selection)
    if not isinstance(provider, FreezableVLMProvider):
        provider.__class__ = freezable_class(type(provider))
    write_selection(provider, selection)
    return provider
