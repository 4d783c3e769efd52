"""``FreezableVLMProvider``: the flags and the plugin's build on any Bridge VLM provider.

Put the mixin first among the bases of a Bridge provider dataclass::

    @dataclass
    class MyQwen(FreezableVLMProvider, Qwen3VLMoEModelProvider):
        pass

    provider = MyQwen(..., freeze_vision_model=True)   # everything but the vision encoder trains

or turn an existing provider (e.g. from ``AutoBridge.to_megatron_provider()``) into one with
:func:`make_freezable`, which also writes a selection to it. The build itself is
:mod:`bridge_freeze_plugin.prewrap._pipeline`; this module only adapts a provider class to it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.mixins.generated import freezable_class
from bridge_freeze_plugin.prewrap import (
    PLUGIN_CLASS_MARK,
    BuildContext,
    FreezeReport,
    HookChain,
    freeze_chunks,
    preflight,
    provide_distributed_frozen,
    provide_frozen,
    resolve_family,
    with_flag_fields,
    write_selection,
)
from bridge_freeze_plugin.request import FreezeSelection

ModelChunks = list[Any]


@dataclasses.dataclass
@with_flag_fields
class FreezableVLMProvider:
    """Mixin for Bridge VLM providers: exactly the selected parts train, or a clear error.

    One ``freeze_<part>`` field per part of the vocabulary (:mod:`bridge_freeze_plugin.request`), default ``False``.
    """

    #: patterns refining the flags per parameter (see ``FreezeSelection``): fields, so that a provider's
    #: ``run_config.yaml`` keeps them
    train_patterns: tuple[str, ...] = ()
    freeze_patterns: tuple[str, ...] = ()
    #: full recompute where it breaks gradients: "fix" (turned off there) or "refuse" (see prewrap.recompute_fix)
    full_recompute_policy: str = "fix"
    #: the former name of ``full_recompute_policy`` (still read; ``None``: unset)
    vision_recompute_policy: str | None = None

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
        context = BuildContext.of(self)
        return None if context.family is None else freeze_chunks(model, context)[0]

    def bridge_freeze_pre_wrap_hook(self, model: ModelChunks) -> ModelChunks:
        """Apply the selection to every chunk and log the report once (usable as a pre-wrap hook)."""
        return HookChain(self, preflight(self), [])(model)

    def provide(
        self, pre_process: bool | None = None, post_process: bool | None = None, vp_stage: int | None = None
    ) -> Any:
        return provide_frozen(self, super().provide, pre_process, post_process, vp_stage)  # type: ignore[misc]

    def provide_distributed_model(self, *args: Any, **kwargs: Any) -> list[Any]:
        return provide_distributed_frozen(self, super().provide_distributed_model, *args, **kwargs)  # type: ignore[misc]


setattr(FreezableVLMProvider, PLUGIN_CLASS_MARK, True)


def make_freezable(provider: Any, selection: FreezeSelection | None = None) -> Any:
    """Make an existing provider freezable in place and write ``selection`` (default: train all).

    The provider keeps its class's behaviour and ``isinstance`` relations; its class becomes the
    freezable subclass (importable by name, so the provider pickles and survives Bridge's
    ``run_config.yaml`` round trip). Raises :class:`UnsupportedFreezeFlagError` at once if ``selection``
    sets a flag and the provider's family is not registered.
    """
    selection = FreezeSelection() if selection is None else selection
    resolve_family(provider, selection)
    if not isinstance(provider, FreezableVLMProvider):
        provider.__class__ = freezable_class(type(provider))
    write_selection(provider, selection)
    return provider
