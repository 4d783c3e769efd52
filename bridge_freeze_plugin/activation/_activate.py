"""Activation: every registered family's Bridge provider honours the flags, however it was made.

``activate()`` runs on ``import bridge_freeze_plugin`` and, for installed-only use, when a process
imports ``megatron.bridge`` (see ``_bridge_freeze_autoload``). For each provider class of each
registered family it installs, in place, once the class's module is imported:

- ``provide()`` and ``provide_distributed_model()`` wrappers running the plugin's build
  (:mod:`bridge_freeze_plugin.prewrap._pipeline`);
- the flags (one per part of the vocabulary) as :class:`~bridge_freeze_plugin.prewrap._flags.FlagField`
  descriptors, defaulting to
  ``False`` (Bridge's ``Qwen3VLMoEModelProvider`` defaults two of them to ``True``); the original
  defaults are remembered and named in the report.

So a provider constructed directly, returned by ``AutoBridge.to_megatron_provider()``, built by a
recipe, or a user's subclass all behave alike. Every OTHER Bridge provider class (no family covers it)
gets a guard on ``provide()`` / ``provide_distributed_model()`` once ``megatron.bridge`` is imported: one of
a flag set there raises ``UnsupportedFreezeFlagError`` instead of building with every tensor
trainable. ``deactivate()`` undoes everything, and keeps the autoload
hook from activating again until ``activate()`` is called. Every record of what was patched lives in
:data:`bridge_freeze_plugin.prewrap._state.STATE`.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from _bridge_freeze_autoload import POST_IMPORT
from bridge_freeze_plugin.activation._class_patch import (
    METHODS,
    all_subclasses,
    patch_defined_class,
    patch_provider_class,
    set_function_default,
)
from bridge_freeze_plugin.activation._module_hooks import (
    GET_MODEL,
    check_part_learning_rates,
    check_resume_selection,
    guard_adapter_exports,
    record_run_configs,
    route_get_model,
)
from bridge_freeze_plugin.activation._provider_fields import remove_fields
from bridge_freeze_plugin.activation._saved_reads import mark_instantiated
from bridge_freeze_plugin.activation._serialised import SERIALISER, watch_saved_configs
from bridge_freeze_plugin.activation._version import warn_untested_bridge
from bridge_freeze_plugin.audit import FINALIZE, arm
from bridge_freeze_plugin.audit import install as install_audit_seam
from bridge_freeze_plugin.export import AUTO_BRIDGE
from bridge_freeze_plugin.families import FamilySpec, class_path
from bridge_freeze_plugin.mixins import allow_targets, disallow_targets
from bridge_freeze_plugin.optim import SETUP_OPTIMIZER_MODULES
from bridge_freeze_plugin.prewrap import (
    INSTANTIATE,
    MISSING,
    RUN_CONFIG_READERS,
    STATE,
    declared_default,
    is_plugin_class,
    keeps,
    on_training_build,
    resolve_family,
)
from bridge_freeze_plugin.ranks import is_rank0
from bridge_freeze_plugin.registry import REGISTRY
from bridge_freeze_plugin.request import FreezeSelection
from bridge_freeze_plugin.stages import (
    CHECKPOINTING,
    CONFIG_CONTAINER,
    LOAD_FROM_PATH,
    install_checkpoint_steps,
    install_config_step,
)

logger = logging.getLogger("bridge_freeze_plugin")


def is_active() -> bool:
    return STATE.active


def patched_classes() -> list[type]:
    return list(STATE.patched)


def activate() -> None:
    """Make every registered family's providers honour the flags (idempotent, cheap, lazy)."""
    with STATE.lock:
        STATE.deactivated_by_user = False
        if STATE.active:
            return
        STATE.active = True
    REGISTRY.load_entry_points()
    allow_targets()
    for spec in REGISTRY:
        _watch(spec)
    POST_IMPORT.watch(AUTO_BRIDGE[0], guard_adapter_exports)
    POST_IMPORT.watch(GET_MODEL[0], route_get_model)
    for module, _ in RUN_CONFIG_READERS:
        POST_IMPORT.watch(module, record_run_configs)
    POST_IMPORT.watch(INSTANTIATE[0], mark_instantiated)
    POST_IMPORT.watch(SERIALISER[0], watch_saved_configs)  # run_config.yaml: unset plugin fields left out
    for module in SETUP_OPTIMIZER_MODULES:
        POST_IMPORT.watch(module, check_part_learning_rates)
    POST_IMPORT.watch(LOAD_FROM_PATH[0], check_resume_selection)  # a resume's selection against its checkpoint's
    # save_trainable_only: cfg.peft before setup(); each save records its base, each load checks it (after the above)
    POST_IMPORT.watch(CONFIG_CONTAINER[0], install_config_step)
    POST_IMPORT.watch(CHECKPOINTING, install_checkpoint_steps)
    on_training_build(arm)  # the run-time audit arms after each build for training
    POST_IMPORT.watch(FINALIZE[0], install_audit_seam)
    if _BRIDGE in sys.modules:  # imported, or finishing its import (the autoload hook runs then)
        warn_untested_bridge()
        _guard_uncovered_providers(sys.modules[_BRIDGE])
    else:
        POST_IMPORT.watch(_BRIDGE, warn_untested_bridge)
        POST_IMPORT.watch(_BRIDGE, _guard_uncovered_providers)


def autoload_activate() -> None:
    """What the autoload hook calls: activates unless the user called :func:`deactivate`."""
    if not STATE.deactivated_by_user:
        activate()


def _watch(spec: FamilySpec) -> None:
    for path in spec.providers:
        module, _, qualname = path.partition(":")
        POST_IMPORT.watch(module, functools.partial(_patch_from_module, qualname=qualname, family=spec.name))


def _on_register(spec: FamilySpec) -> None:
    """A family registered while the plugin is active (in code, or by an entry point) is patched too."""
    if STATE.active:
        _watch(spec)


REGISTRY.subscribe(_on_register)


def deactivate() -> None:
    """Undo every patch (classes, defaults); the autoload hook will not activate again on its own."""
    with STATE.lock:
        for record in (STATE.patched, STATE.guarded):
            for cls, originals in record.items():
                for name, value in originals.items():
                    _restore(cls, name, value)
            record.clear()
        for func, flag, value in STATE.init_defaults:
            set_function_default(func, flag, value)
        STATE.init_defaults.clear()
        for cls, undo in STATE.fields_added.items():
            remove_fields(cls, undo)
        STATE.fields_added.clear()
        for cls, flag, fld, value in STATE.field_defaults:
            fld.default = value
            _restore_later_subclasses(cls, flag, fld, value)
        STATE.field_defaults.clear()
        STATE.original_defaults.clear()
        disallow_targets()
        STATE.active = False
        STATE.deactivated_by_user = True


def _restore(cls: type, name: str, value: Any) -> None:
    """Put back what ``cls.__dict__[name]`` held (``MISSING``: nothing, so delete what the plugin set)."""
    if value is not MISSING:
        setattr(cls, name, value)
    elif name in cls.__dict__:
        delattr(cls, name)


def _restore_later_subclasses(cls: type, flag: str, fld: Any, value: Any) -> None:
    """Subclasses dataclass'd while active baked ``False`` into their ``__init__``: give back ``value``."""
    for klass in all_subclasses(cls):
        init = klass.__dict__.get("__init__")
        if init is not None and getattr(klass, "__dataclass_fields__", {}).get(flag) is fld:
            set_function_default(init, flag, value)


#: (module, class) a family names that the installed Bridge's module lacks, said once per process.
_ABSENT_SAID: set[tuple[str, str]] = set()


def _patch_from_module(module: ModuleType, qualname: str, family: str = "") -> None:
    if not STATE.active:
        return
    obj: Any = module
    for attr in qualname.split("."):
        obj = getattr(obj, attr, None)
        if obj is None:
            # Another Bridge version (Gemma4DenseVLProvider is not in 0.6.0): nothing to patch, and nothing can
            # build it either, so no flag goes unhonoured: said once, at DEBUG (it was a WARNING at every import).
            if is_rank0() and (module.__name__, qualname) not in _ABSENT_SAID:
                _ABSENT_SAID.add((module.__name__, qualname))
                logger.debug("bridge-freeze: this Bridge's %s has no %s (family %s names it for other Bridge "
                             "versions); nothing to patch there", module.__name__, qualname, family)
            return
    patch_provider_class(obj)


# ------------------------------------------------------------------------------------------------
# Guards on the providers no family covers.
# ------------------------------------------------------------------------------------------------

_BRIDGE = "megatron.bridge"
_PROVIDER_BASE = ("megatron.bridge.models.model_provider", "ModelProviderMixin")


def _guard(original: Callable[..., Any]) -> Callable[..., Any]:
    @keeps(original, mark=False)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _left_to_bridge(self):
            resolve_family(self)  # a flag set on a provider no family covers raises, before any build
        return original(self, *args, **kwargs)

    guarded.__bridge_freeze_guarded__ = original  # type: ignore[attr-defined]
    return guarded


def _left_to_bridge(provider: Any) -> bool:
    """A provider no family covers, whose set flags are all its class's OWN fields: Bridge's freeze honours them.

    (Bridge's MIMO providers declare ``freeze_language_model``, and Nemotron Omni's abstract
    ``NemotronVLModelProvider`` base the vision-language flags, and apply them in their own ``provide()``; the
    Qwen Omni / Audio / ASR providers have families, so the plugin applies theirs.) The plugin lets that run, and
    says so once per class on rank 0: its own table, guarantee and report do not cover such a provider. A flag the
    class does not declare, or a pattern, is refused as before (nothing in Bridge would honour it).
    """
    selection = FreezeSelection.from_object(provider)
    if not selection.any_set or selection.patterns:
        return False
    cls = type(provider)
    if not all(declared_default(cls, flag) is not None for flag in selection.set_flags()):
        return False
    # a flag a family's class declares, inherited by a class no family covers that builds a model of its own
    # (Bridge's diffusion LM under Ministral3's provider): no freeze of Bridge's honours it there
    if any(REGISTRY.for_provider_class(_declarer(cls, flag)) is not None for flag in selection.set_flags()):
        return False
    with STATE.lock:
        first = cls not in STATE.left_to_bridge
        STATE.left_to_bridge.add(cls)
    if first and is_rank0():
        logger.warning(
            "bridge-freeze: no family covers %s; its own %s %s applied by Bridge's freeze, not checked by the "
            "plugin (no table, guarantee or report). Register a family to have the plugin apply it.",
            class_path(cls).replace(":", "."), ", ".join(f"{f}=True" for f in selection.set_flags()),
            "is" if len(selection.set_flags()) == 1 else "are",
        )
    return True


def _declarer(cls: type, flag: str) -> type:
    """The class of ``cls``'s hierarchy (the plugin's own skipped) that declares ``flag``."""
    import inspect

    for klass in cls.__mro__:
        if not is_plugin_class(klass) and (flag in inspect.get_annotations(klass)
                                           or (klass, flag) in STATE.original_defaults):
            return klass
    return cls


def _guard_uncovered_providers(_module: ModuleType) -> None:
    """Guard every loaded provider class no family covers, and every one defined from now on."""
    base = getattr(sys.modules.get(_PROVIDER_BASE[0]), _PROVIDER_BASE[1], None)
    if base is None or not STATE.active:
        return
    with STATE.lock:
        registered = _registered_paths()
        for klass in [base, *all_subclasses(base)]:
            if class_path(klass) in registered and not any(is_plugin_class(k) for k in klass.__mro__):
                patch_provider_class(klass)  # every live class of a family (also one made by a reload)
            elif _overrides_family_build(klass):
                patch_provider_class(klass)
            else:
                _guard_class(klass)
        if "__init_subclass__" not in STATE.guarded.get(base, {}):
            original = base.__dict__.get("__init_subclass__", MISSING)
            STATE.guarded.setdefault(base, {})["__init_subclass__"] = original
            base.__init_subclass__ = classmethod(_guarding_init_subclass)  # type: ignore[assignment]


def _guarding_init_subclass(cls: type, **kwargs: Any) -> None:
    """``__init_subclass__`` of Bridge's provider base while active: a later provider class is guarded too."""
    base = getattr(sys.modules.get(_PROVIDER_BASE[0]), _PROVIDER_BASE[1], None)
    original = STATE.guarded.get(base, {}).get("__init_subclass__", MISSING) if base is not None else MISSING
    if original is not MISSING:
        original.__get__(None, cls)(**kwargs)
    else:
        super(base, cls).__init_subclass__(**kwargs)  # type: ignore[arg-type]
    if not STATE.active:
        return
    if class_path(cls) in _registered_paths() or _overrides_family_build(cls):
        patch_defined_class(cls)  # a family's provider class made anew (importlib.reload, exec, ...)
    else:
        _guard_class(cls)


def _overrides_family_build(cls: type) -> bool:
    """A subclass of a family's provider with a ``provide()`` / ``provide_distributed_model()`` of its own (Bridge
    0.7.0's ``Qwen35TokenClassificationModelProvider`` swaps the output layer after its base's build): its build
    is the outermost, so it is wrapped too and the selection applies to the model it returns."""
    if REGISTRY.for_provider_class(cls) is None or any(is_plugin_class(k) for k in cls.__mro__):
        return False
    own = [cls.__dict__.get(name) for name, _ in METHODS]
    return any(callable(m) and not hasattr(m, "__bridge_freeze_wrapped__") for m in own)


def _registered_paths() -> set[str]:
    return {path for spec in REGISTRY for path in spec.providers}


def _guard_class(klass: type) -> None:
    if REGISTRY.for_provider_class(klass) is not None or any(is_plugin_class(k) for k in klass.__mro__):
        return  # patched with the family's build (or the plugin's own class)
    for name in ("provide", "provide_distributed_model"):
        method = klass.__dict__.get(name)
        if not callable(method) or getattr(method, "__isabstractmethod__", False):
            continue
        if hasattr(method, "__bridge_freeze_guarded__") or hasattr(method, "__bridge_freeze_wrapped__"):
            continue
        STATE.guarded.setdefault(klass, {})[name] = method
        setattr(klass, name, _guard(method))


