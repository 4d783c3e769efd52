"""In-place patches of a family's provider class: ``provide()`` / ``provide_distributed_model()`` wrapped to run the
plugin's build, each flag a :class:`~bridge_freeze_plugin.prewrap.FlagField` defaulting to ``False`` (the class's
own default remembered for the report), the plugin's fields declared; and the helpers that undo them."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from dataclasses import MISSING as NO_DEFAULT
from typing import Any

from bridge_freeze_plugin.activation._provider_fields import PLUGIN_FIELDS, add_fields
from bridge_freeze_plugin.prewrap import (
    MISSING,
    STATE,
    FlagField,
    flag_attributes,
    is_plugin_class,
    keeps,
    provide_distributed_frozen,
    provide_frozen,
)
from bridge_freeze_plugin.request import FLAGS

logger = logging.getLogger("bridge_freeze_plugin")


def _wrap(original: Callable[..., Any], run: Callable[..., Any]) -> Callable[..., Any]:
    @keeps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        return run(self, functools.partial(original, self), *args, **kwargs)

    return wrapper


METHODS = (("provide", provide_frozen), ("provide_distributed_model", provide_distributed_frozen))

#: Methods whose wrapper belongs where Bridge's own method is entered, not on an override above it: a subclass's
#: ``provide_distributed_model`` that calls ``super()`` reaches its base's wrapper, which installs the hook chain
#: as Bridge's own method's ``pre_wrap_hook`` argument. Wrapping the override too would hand the chain to the
#: override as a keyword (a strict signature raises TypeError; one that forwards only what it knows drops it).
_AT_BRIDGE_ENTRY = frozenset({"provide_distributed_model"})


def _needs_wrapper(cls: type, name: str) -> bool:
    """Whether ``cls.<name>`` gets a wrapper of its own (not when it has one, or a base's is reached by super())."""
    if getattr(getattr(cls, name), "__bridge_freeze_wrapped__", None) is not None:
        return False  # inherited from an already patched base
    if name in _AT_BRIDGE_ENTRY:
        return not any(getattr(vars(base).get(name), "__bridge_freeze_wrapped__", None) is not None
                       for base in cls.__mro__[1:])
    return True


def patch_provider_class(cls: type) -> None:
    """Patch one provider class in place (idempotent). Subclasses inherit the wrappers."""
    with STATE.lock:
        if cls in STATE.patched or any(is_plugin_class(k) for k in cls.__mro__):
            return
        originals: dict[str, Any] = {}
        for name, run in METHODS:
            if _needs_wrapper(cls, name):
                originals[name] = cls.__dict__.get(name, MISSING)
                setattr(cls, name, _wrap(getattr(cls, name), run))
        STATE.patched[cls] = originals
        for flag in flag_attributes(cls):
            _default_flag_to_false(cls, flag)
            _install_flag(cls, flag)
        for klass in [cls, *all_subclasses(cls)]:
            if klass not in STATE.fields_added and not is_plugin_class(klass):
                STATE.fields_added[klass] = add_fields(klass)
        logger.debug("bridge-freeze: patched %s.%s", cls.__module__, cls.__qualname__)


def _install_flag(cls: type, flag: str) -> None:
    """The flag as a :class:`FlagField` on ``cls`` (default False) and on subclasses that redeclare it."""
    for klass in [cls, *all_subclasses(cls)]:
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
    for klass in [cls, *all_subclasses(cls)]:
        init = klass.__dict__.get("__init__")
        if init is not None and getattr(klass, "__dataclass_fields__", {}).get(flag) is fld:
            old = set_function_default(init, flag, False)
            if old is not MISSING:
                STATE.init_defaults.append((init, flag, old))


def all_subclasses(cls: type) -> list[type]:
    found: list[type] = []
    stack = list(cls.__subclasses__())
    while stack:
        klass = stack.pop()
        found.append(klass)
        stack.extend(klass.__subclasses__())
    return found


def set_function_default(func: Any, name: str, value: Any) -> Any:
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


def patch_defined_class(cls: type) -> None:
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
        for name, run in METHODS:
            if _needs_wrapper(cls, name):
                originals[name] = cls.__dict__.get(name, MISSING)
                setattr(cls, name, _wrap(getattr(cls, name), run))
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
