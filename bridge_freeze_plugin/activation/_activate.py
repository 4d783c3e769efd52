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
import inspect
import logging
import sys
from collections.abc import Callable
from dataclasses import MISSING as NO_DEFAULT
from types import ModuleType
from typing import Any

from _bridge_freeze_autoload import POST_IMPORT
from bridge_freeze_plugin.activation import freezable as generated
from bridge_freeze_plugin.activation._provider_fields import PLUGIN_FIELDS, add_fields, remove_fields
from bridge_freeze_plugin.activation._saved_reads import mark_instantiated
from bridge_freeze_plugin.activation._version import warn_untested_bridge
from bridge_freeze_plugin.export import AUTO_BRIDGE, GUARDS
from bridge_freeze_plugin.families import REGISTRY, FamilySpec, class_path
from bridge_freeze_plugin.optim import SETUP_OPTIMIZER, SETUP_OPTIMIZER_MODULES, checked_setup_optimizer
from bridge_freeze_plugin.prewrap import (
    INSTANTIATE,
    MISSING,
    RUN_CONFIG_READERS,
    STATE,
    FlagField,
    declared_default,
    flag_attributes,
    get_model_frozen,
    is_plugin_class,
    provide_distributed_frozen,
    provide_frozen,
    recording,
    resolve_family,
)
from bridge_freeze_plugin.ranks import is_rank0
from bridge_freeze_plugin.request import FLAGS, FreezeSelection

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
    generated.allow_targets()
    for spec in REGISTRY:
        _watch(spec)
    POST_IMPORT.watch(AUTO_BRIDGE[0], _guard_adapter_exports)
    POST_IMPORT.watch(_GET_MODEL[0], _route_get_model)
    for module, _ in RUN_CONFIG_READERS:
        POST_IMPORT.watch(module, _record_run_configs)
    POST_IMPORT.watch(INSTANTIATE[0], mark_instantiated)
    for module in SETUP_OPTIMIZER_MODULES:
        POST_IMPORT.watch(module, _check_part_learning_rates)
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
        POST_IMPORT.watch(module, functools.partial(_patch_from_module, qualname=qualname))


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
            _set_function_default(func, flag, value)
        STATE.init_defaults.clear()
        for cls, undo in STATE.fields_added.items():
            remove_fields(cls, undo)
        STATE.fields_added.clear()
        for cls, flag, fld, value in STATE.field_defaults:
            fld.default = value
            _restore_later_subclasses(cls, flag, fld, value)
        STATE.field_defaults.clear()
        STATE.original_defaults.clear()
        generated.disallow_targets()
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
    for klass in _all_subclasses(cls):
        init = klass.__dict__.get("__init__")
        if init is not None and getattr(klass, "__dataclass_fields__", {}).get(flag) is fld:
            _set_function_default(init, flag, value)


def _patch_from_module(module: ModuleType, qualname: str) -> None:
    if not STATE.active:
        return
    obj: Any = module
    for attr in qualname.split("."):
        obj = getattr(obj, attr, None)
        if obj is None:
            if is_rank0():
                logger.warning("bridge-freeze: %s has no %s; that provider is not patched", module.__name__, qualname)
            return
    patch_provider_class(obj)


# ------------------------------------------------------------------------------------------------
# Guards on the providers no family covers.
# ------------------------------------------------------------------------------------------------

_BRIDGE = "megatron.bridge"
_PROVIDER_BASE = ("megatron.bridge.models.model_provider", "ModelProviderMixin")


def _guard(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
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


def _guard_uncovered_providers(_module: ModuleType) -> None:
    """Guard every loaded provider class no family covers, and every one defined from now on."""
    base = getattr(sys.modules.get(_PROVIDER_BASE[0]), _PROVIDER_BASE[1], None)
    if base is None or not STATE.active:
        return
    with STATE.lock:
        registered = _registered_paths()
        for klass in [base, *_all_subclasses(base)]:
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
        _patch_defined_class(cls)  # a family's provider class made anew (importlib.reload, exec, ...)
    else:
        _guard_class(cls)


def _overrides_family_build(cls: type) -> bool:
    """A subclass of a family's provider with a ``provide()`` / ``provide_distributed_model()`` of its own (Bridge
    0.7.0's ``Qwen35TokenClassificationModelProvider`` swaps the output layer after its base's build): its build
    is the outermost, so it is wrapped too and the selection applies to the model it returns."""
    if REGISTRY.for_provider_class(cls) is None or any(is_plugin_class(k) for k in cls.__mro__):
        return False
    own = [cls.__dict__.get(name) for name, _ in _METHODS]
    return any(callable(m) and not hasattr(m, "__bridge_freeze_wrapped__") for m in own)


def _registered_paths() -> set[str]:
    return {path for spec in REGISTRY for path in spec.providers}


def _patch_defined_class(cls: type) -> None:
    """Patch a registered provider class while it is being made (from ``__init_subclass__``).

    ``importlib.reload`` of a Bridge provider module, or any other route that defines a family's provider
    class after activation, makes a NEW class object that the import-time patch never saw. It is patched
    here, before ``@dataclass`` processes its body: the methods are wrapped, and each flag becomes a
    :class:`FlagField` defaulting to ``False`` (``@dataclass`` reads that as the field's default, and keeps
    the descriptor); the default the class body declared is remembered for the report.
    """
    with STATE.lock:
        if cls in STATE.patched:
            return
        originals: dict[str, Any] = {}
        for name, run in _METHODS:
            current = getattr(cls, name)
            if getattr(current, "__bridge_freeze_wrapped__", None) is None:
                originals[name] = cls.__dict__.get(name, MISSING)
                setattr(cls, name, _wrap(current, run))
        annotations = inspect.get_annotations(cls)
        for flag in flag_attributes(cls):
            raw = cls.__dict__.get(flag, MISSING)
            default = getattr(raw, "default", raw)  # a dataclasses.field(default=...) or the value itself
            if flag in annotations and isinstance(default, bool):
                STATE.original_defaults[(cls, flag)] = default
            originals[flag] = raw
            setattr(cls, flag, FlagField(False, flag))
        STATE.patched[cls] = originals
        _declare_plugin_fields(cls)


def _declare_plugin_fields(cls: type) -> None:
    """The plugin's fields in a class body ``@dataclass`` has not processed yet (it makes them fields)."""
    annotations = vars(cls).get("__annotations__")
    if annotations is None:
        annotations = {}
        type.__setattr__(cls, "__annotations__", annotations)
    undo: dict[str, Any] = {}
    inherited = {name for klass in cls.__mro__[1:] for name in getattr(klass, "__dataclass_fields__", {})}
    for flag in FLAGS:  # a flag neither this body nor a base declares: a field too (its descriptor stays)
        if flag not in annotations and flag not in inherited:
            annotations[flag] = "bool"
    for name, fld in PLUGIN_FIELDS.items():
        if name not in annotations:
            annotations[name] = fld.type
            undo[name] = cls.__dict__.get(name, MISSING)
            setattr(cls, name, fld.default)
    STATE.patched[cls].update(undo)


def _guard_adapter_exports(module: ModuleType) -> None:
    """Bridge's adapter-only exports refuse a run with full-rank parts (:mod:`bridge_freeze_plugin.export`)."""
    cls = getattr(module, AUTO_BRIDGE[1], None)
    if cls is None or not STATE.active:
        return
    with STATE.lock:
        for name, guard in GUARDS.items():
            method = cls.__dict__.get(name)
            if callable(method) and not hasattr(method, "__bridge_freeze_wrapped__"):
                STATE.guarded.setdefault(cls, {})[name] = method
                setattr(cls, name, guard(name, method))


#: Bridge's public build function (NeMo-RL and other trainers call it directly with their own hooks).
_GET_MODEL = ("megatron.bridge.models.model_provider", "get_model")


def _route_get_model(module: ModuleType) -> None:
    """``get_model`` runs its hooks inside the plugin's chain (:func:`~.build.pipeline.get_model_frozen`)."""
    original = module.__dict__.get(_GET_MODEL[1])
    if not STATE.active or not callable(original) or hasattr(original, "__bridge_freeze_wrapped__"):
        return
    with STATE.lock:
        STATE.guarded.setdefault(module, {})[_GET_MODEL[1]] = original  # type: ignore[index]
        routed = functools.wraps(original)(functools.partial(get_model_frozen, original))
        routed.__bridge_freeze_wrapped__ = original  # type: ignore[attr-defined]
        setattr(module, _GET_MODEL[1], routed)


def _record_run_configs(module: ModuleType) -> None:
    """Bridge's ``read_run_config`` records the saved configs it reads (``prewrap._saved``: flag provenance)."""
    name = RUN_CONFIG_READERS[0][1]
    original = module.__dict__.get(name)
    if not STATE.active or not callable(original):
        return
    with STATE.lock:
        if hasattr(original, "__bridge_freeze_wrapped__"):  # imported by name from the wrapped module
            STATE.guarded.setdefault(module, {})[name] = original.__bridge_freeze_wrapped__  # type: ignore[index]
            return
        STATE.guarded.setdefault(module, {})[name] = original  # type: ignore[index]
        setattr(module, name, recording(original))


def _check_part_learning_rates(module: ModuleType) -> None:
    """Bridge's ``setup_optimizer`` verifies per-part learning rates (``optim._setup_check``)."""
    original = module.__dict__.get(SETUP_OPTIMIZER)
    if not STATE.active or not callable(original):
        return
    with STATE.lock:
        if hasattr(original, "__bridge_freeze_wrapped__"):
            # imported by name from a module already wrapped (setup.py takes it from optim.py): deactivate must
            # give this module Bridge's own function back too
            STATE.guarded.setdefault(module, {})[SETUP_OPTIMIZER] = original.__bridge_freeze_wrapped__  # type: ignore[index]
            return
        STATE.guarded.setdefault(module, {})[SETUP_OPTIMIZER] = original  # type: ignore[index]
        setattr(module, SETUP_OPTIMIZER, checked_setup_optimizer(original))


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


# ------------------------------------------------------------------------------------------------
# In-place class patches.
# ------------------------------------------------------------------------------------------------


def _wrap(original: Callable[..., Any], run: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        return run(self, functools.partial(original, self), *args, **kwargs)

    wrapper.__bridge_freeze_wrapped__ = original  # type: ignore[attr-defined]
    return wrapper


_METHODS = (("provide", provide_frozen), ("provide_distributed_model", provide_distributed_frozen))


def patch_provider_class(cls: type) -> None:
    """Patch one provider class in place (idempotent). Subclasses inherit the wrappers."""
    with STATE.lock:
        if cls in STATE.patched or any(is_plugin_class(k) for k in cls.__mro__):
            return
        originals: dict[str, Any] = {}
        for name, run in _METHODS:
            current = getattr(cls, name)
            if getattr(current, "__bridge_freeze_wrapped__", None) is not None:
                continue  # inherited from an already patched base
            originals[name] = cls.__dict__.get(name, MISSING)
            setattr(cls, name, _wrap(current, run))
        STATE.patched[cls] = originals
        for flag in flag_attributes(cls):
            _default_flag_to_false(cls, flag)
            _install_flag(cls, flag)
        for klass in [cls, *_all_subclasses(cls)]:
            if klass not in STATE.fields_added and not is_plugin_class(klass):
                STATE.fields_added[klass] = add_fields(klass)
        logger.debug("bridge-freeze: patched %s.%s", cls.__module__, cls.__qualname__)


def _install_flag(cls: type, flag: str) -> None:
    """The flag as a :class:`FlagField` on ``cls`` (default False) and on subclasses that redeclare it."""
    for klass in [cls, *_all_subclasses(cls)]:
        current = klass.__dict__.get(flag, MISSING)
        if klass is not cls and (current is MISSING or isinstance(current, FlagField)):
            continue
        if isinstance(current, FlagField):
            continue
        STATE.patched.setdefault(klass, {})[flag] = current
        default = False if klass is cls or not isinstance(current, bool) else current
        setattr(klass, flag, FlagField(default, flag))


def _default_flag_to_false(cls: type, flag: str) -> None:
    """Make ``False`` the default of ``flag`` on ``cls`` and its existing subclasses."""
    fld = getattr(cls, "__dataclass_fields__", {}).get(flag)
    if fld is None or fld.default is NO_DEFAULT or fld.default is False:
        return
    if flag in inspect.get_annotations(cls):
        STATE.original_defaults[(cls, flag)] = bool(fld.default)
    STATE.field_defaults.append((cls, flag, fld, fld.default))
    fld.default = False
    for klass in [cls, *_all_subclasses(cls)]:
        init = klass.__dict__.get("__init__")
        if init is not None and getattr(klass, "__dataclass_fields__", {}).get(flag) is fld:
            old = _set_function_default(init, flag, False)
            if old is not MISSING:
                STATE.init_defaults.append((init, flag, old))


def _all_subclasses(cls: type) -> list[type]:
    found: list[type] = []
    stack = list(cls.__subclasses__())
    while stack:
        klass = stack.pop()
        found.append(klass)
        stack.extend(klass.__subclasses__())
    return found


def _set_function_default(func: Any, name: str, value: Any) -> Any:
    """Replace the default of parameter ``name`` of ``func``; returns the old one (or MISSING)."""
    code = func.__code__
    if func.__kwdefaults__ and name in func.__kwdefaults__:
        old = func.__kwdefaults__[name]
        func.__kwdefaults__ = {**func.__kwdefaults__, name: value}
        return old
    positional = code.co_varnames[: code.co_argcount]
    defaults = func.__defaults__ or ()
    if name not in positional:
        return MISSING
    index = positional.index(name) - (len(positional) - len(defaults))
    if index < 0:
        return MISSING
    old = defaults[index]
    func.__defaults__ = (*defaults[:index], value, *defaults[index + 1 :])
    return old
