"""``FreezableVLMProvider``: the flags and the plugin's build on any Bridge VLM provider.

Put the mixin first among the bases of a Bridge provider dataclass::

    @dataclass
    class MyQwen(FreezableVLMProvider, Qwen3VLMoEModelProvider):
        pass

    provider = MyQwen(..., freeze_vision_model=True)   # everything but the vision encoder trains

or turn an existing provider (e.g. from ``AutoBridge.to_megatron_provider()``) into one with
:func:`make_freezable`, which also writes a selection to it. The build itself is
:mod:`bridge_freeze_plugin.prewrap._pipeline`; this module only adapts a provider class to it.

The module's name is public (the package's other modules are private): Bridge writes a generated subclass's path
into ``run_config.yaml`` and refuses a ``_target_`` with a private segment.

The freezable subclasses :func:`make_freezable` gives existing providers live in THIS module, each under a
public name that encodes the provider class it extends (``FreezableQwen3VLModelProvider_<encoded import path>``),
so pickle, ``copy``, multiprocessing and
Bridge's ``run_config.yaml`` (``_target_: bridge_freeze_plugin.mixins.freezable.Freezable...``) can look
it up; in a fresh process, the module's ``__getattr__`` decodes the name, imports the provider class
and makes the subclass again. The paths earlier versions wrote (:data:`FORMER_MODULES`:
``bridge_freeze_plugin.mixins.generated.``, ``bridge_freeze_plugin.activation.freezable.``) forward here.

Bridge only instantiates ``_target_`` paths under allowed prefixes: this module's path is added to that
allowlist once Bridge's ``instantiate_utils`` is imported. A decoded name is honoured only for a provider
class that Bridge's own allowlist accepts or that a registered family names, so the allowance cannot be
used to reach any other class.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Any

from _bridge_freeze_autoload import POST_IMPORT
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.prewrap import (
    PLUGIN_CLASS_MARK,
    STATE,
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


# ---- the generated subclasses ----

#: Bridge's module that validates and instantiates ``_target_`` paths.
_BRIDGE_INSTANTIATE = "megatron.bridge.utils.instantiate_utils"

_PREFIX = "Freezable"
#: Reversible escapes: the encoded import path uses only letters, digits and "_".
_ESCAPES = (("_", "_u"), (".", "_d"), (":", "_c"))


def _encode(path: str) -> str:
    for char, escape in _ESCAPES:
        path = path.replace(char, escape)
    return path


def _decode(token: str) -> str:
    out, i = [], 0
    reverse = {escape[1]: char for char, escape in _ESCAPES}
    while i < len(token):
        if token[i] == "_" and i + 1 < len(token) and token[i + 1] in reverse:
            out.append(reverse[token[i + 1]])
            i += 2
        else:
            out.append(token[i])
            i += 1
    return "".join(out)


def class_name(cls: type) -> str:
    """The public name of ``cls``'s freezable subclass in this module."""
    return f"{_PREFIX}{cls.__name__}_x{_encode(f'{cls.__module__}:{cls.__qualname__}')}"


def freezable_class(cls: type) -> type:
    """The (cached) dataclass ``FreezableVLMProvider`` subclass of a provider class."""
    if issubclass(cls, FreezableVLMProvider):
        return cls
    generated = STATE.generated.get(cls)
    if generated is None:
        name = class_name(cls)
        namespace = {"__module__": __name__, PLUGIN_CLASS_MARK: True,
                     "__doc__": f"{cls.__name__} with bridge-freeze-plugin's FreezableVLMProvider."}
        generated = dataclasses.dataclass(type(name, (FreezableVLMProvider, cls), namespace))
        generated.__qualname__ = name
        STATE.generated[cls] = generated
        setattr(sys.modules[__name__], name, generated)
    return generated


def _may_extend(path: str) -> bool:
    """Whether a decoded ``module:QualName`` may be imported: a registered provider, or Bridge allows it."""
    from bridge_freeze_plugin.registry import REGISTRY

    if any(path in spec.providers for spec in REGISTRY):
        return True
    instantiate_utils = sys.modules.get(_BRIDGE_INSTANTIATE)
    allowlist = getattr(instantiate_utils, "target_allowlist", None)
    dotted = path.replace(":", ".")
    return allowlist is not None and not dotted.startswith("bridge_freeze_plugin.") and bool(
        allowlist.is_allowed(dotted))


def __getattr__(name: str) -> Any:
    """Make a freezable subclass on demand from its encoded name (unpickling in a fresh process)."""
    base_name, sep, token = name.rpartition("_x")  # the encoded path never holds "_x"
    path = _decode(token) if sep else ""
    if not name.startswith(_PREFIX) or not _may_extend(path):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for attr in qualname.split("."):
        obj = getattr(obj, attr)
    if not isinstance(obj, type) or base_name != f"{_PREFIX}{obj.__name__}" or not callable(
        getattr(obj, "provide", None)
    ):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (not a model provider class)")
    return freezable_class(obj)


#: The plugin's classes a Bridge ``run_config.yaml`` may name as ``_target_``: these freezable subclasses, and
#: the per-part learning-rate provider (``optimizer_config_override_provider``) and ``save_trainable_only``'s PEFT.
#: The modules where earlier versions kept these subclasses (a saved ``run_config.yaml`` may name them): each
#: forwards every name here.
FORMER_MODULES = ("bridge_freeze_plugin.mixins.generated", "bridge_freeze_plugin.activation.freezable")
ALLOWED_TARGET_PREFIXES = (__name__ + ".", *(f"{module}." for module in FORMER_MODULES),
                           "bridge_freeze_plugin.optim.bridge.", "bridge_freeze_plugin.stages.bridge.")


def _allow_in_bridge_targets(module: Any) -> None:
    register = getattr(module, "register_allowed_target_prefix", None)
    if register is not None:
        for prefix in ALLOWED_TARGET_PREFIXES:
            register(prefix)


def allow_targets() -> None:
    """Let Bridge's ``instantiate`` build the plugin's classes (now, or once Bridge's module is imported)."""
    POST_IMPORT.watch(_BRIDGE_INSTANTIATE, _allow_in_bridge_targets)


def disallow_targets() -> None:
    """Take the plugin's prefixes off Bridge's ``_target_`` allowlist again (``deactivate()``)."""
    module = sys.modules.get(_BRIDGE_INSTANTIATE)
    if module is None:
        return
    prefixes = getattr(module, "_ALLOWED_TARGET_PREFIXES", None)
    allowlist = getattr(module, "target_allowlist", None)
    for prefix in ALLOWED_TARGET_PREFIXES:
        if isinstance(prefixes, set):
            prefixes.discard(prefix)
        if allowlist is not None and prefix in allowlist.allowed_prefixes:
            allowlist.remove_prefix(prefix)


allow_targets()
