"""The family registry: which module prefixes make up each part of each VLM family.

Family knowledge is data (:class:`FamilySpec`, one per family, see :mod:`bridge_freeze_plugin.families`);
everything here is generic. Provider classes are named by import path (``"package.module:Class"``)
and are only compared by name, so listing or looking up families imports no model code.

Usage, in the spirit of timm's ``@register_model`` and PEFT's ``register_peft_method``::

    from bridge_freeze_plugin import register_family

    register_family(
        "my_vlm",
        providers=["my_pkg.provider:MyVLMProvider"],
        language_model=["language_model"],
        vision_model=["vision_tower"],
        vision_projection=["projector"],
    )
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bridge_freeze_plugin.errors import FamilyRegistrationError, UnknownFamilyError
from bridge_freeze_plugin.ranks import is_rank0
from bridge_freeze_plugin.selection import SELECTABLE_PARTS, Part

#: Wrappers (Float16Module, DDP) put their wrapped module under this attribute.
_WRAPPER_PREFIX = "module."
#: Up to this many prefixes, :meth:`FamilySpec.classify` tests them in turn (faster than walking
#: the name up through a dict, one ``rfind`` + slice per module level); above it, it walks.
_MAX_LINEAR_PREFIXES = 16


def canonical_name(name: str) -> str:
    """A parameter name as a pre-wrap hook sees it: strips the ``module.`` added by wrappers."""
    while name.startswith(_WRAPPER_PREFIX):
        name = name[len(_WRAPPER_PREFIX) :]
    return name


def class_path(cls: type) -> str:
    """``"module:QualName"`` of a class, the form provider paths are registered in."""
    return f"{cls.__module__}:{cls.__qualname__}"


#: A family name: what ``plan``, ``check-config --family`` and ``get_family()`` take.
_FAMILY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
#: One segment of a module path as ``named_parameters()`` spells it: an attribute name, or a list index.
_SEGMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")


def _string_tuple(family: Any, attr: str, value: Any) -> tuple[str, ...]:
    """``value`` as a tuple of strings (a provider class object is written as its import path)."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise FamilyRegistrationError(
            f"family {family!r}: {attr} must be a list of strings, not {type(value).__name__} {value!r}"
        )
    items = []
    for item in value:
        if attr == "providers" and isinstance(item, type):
            item = class_path(item)
        if not isinstance(item, str):
            what = "'package.module:ClassName' strings or classes" if attr == "providers" else "strings"
            raise FamilyRegistrationError(
                f"family {family!r}: {attr} must hold {what}, got {type(item).__name__} {item!r}"
            )
        items.append(item)
    return tuple(items)


def _check_providers(family: str, providers: tuple[str, ...]) -> None:
    if not providers:
        raise FamilyRegistrationError(f"family {family!r} names no provider class")
    for path in providers:
        module, sep, qualname = path.partition(":")
        dotted = [*module.split("."), *(s for s in qualname.split(".") if s != "<locals>")]
        if not sep or not module or not qualname or not all(s.isidentifier() for s in dotted):
            raise FamilyRegistrationError(
                f"family {family!r}: provider {path!r} must be written 'package.module:ClassName'"
            )


def _check_prefix(family: str, part: Part, prefix: str) -> None:
    """A prefix names a module as a bare chunk's ``named_parameters()`` does, or it could never match."""
    segments = prefix.split(".")
    if all(_SEGMENT.fullmatch(s) for s in segments) and segments[0] != _WRAPPER_PREFIX.rstrip("."):
        return
    if segments[0] == _WRAPPER_PREFIX.rstrip("."):
        why = "names a wrapper's 'module.' level, which a bare chunk does not have: drop the 'module.'"
    else:
        why = ("is not a dotted module path (attribute names and list indices only: no spaces, wildcards or "
               "regular expressions; a prefix covers every parameter below it)")
    raise FamilyRegistrationError(
        f"family {family!r}: bad prefix {prefix!r} for {part.value}: it can never match a parameter, since it {why}"
    )


@dataclass(frozen=True)
class FamilySpec:
    """One VLM family: the provider classes it covers and the module prefixes of each part.

    A prefix names a module (``"visual.merger"``) and covers every parameter below it. A parameter
    belongs to the part with the longest (most specific) matching prefix, so a projection that
    lives inside the vision module (``visual.merger`` inside ``visual``) is the projection.
    ``other`` lists known modules that belong to none of the three parts (an audio tower, say):
    no flag touches them, and the report shows them on their own line.
    """

    name: str
    providers: tuple[str, ...]
    language_model: tuple[str, ...]
    vision_model: tuple[str, ...]
    vision_projection: tuple[str, ...]
    other: tuple[str, ...] = ()
    description: str = ""
    #: HF ``config.json`` ``model_type`` values of this family (to recognise a checkpoint or config).
    hf_model_types: tuple[str, ...] = ()
    #: Known Bridge issue: under full activation recompute the projection (part of it) gets no gradient.
    projection_needs_recompute_off: bool = False
    #: Why, in one clause a message can quote (family knowledge stays in the family's table).
    recompute_note: str = ""
    #: Modules (prefixes) whose full activation recompute gives wrong gradients: the plugin turns recompute off
    #: in their configs when one of ``full_recompute_affects`` trains under full recompute.
    no_full_recompute: tuple[str, ...] = ()
    #: The parts whose gradients that recompute gets wrong (their training triggers the fix).
    full_recompute_affects: tuple[str, ...] = ()
    #: Who registered it: "builtin", or the distribution that provided an entry point.
    source: str = "builtin"
    _index: dict[str, Part] = field(default_factory=dict, init=False, repr=False, compare=False)
    #: (prefix, prefix + ".", part), longest prefix first: the fast path of :meth:`classify`.
    _ordered: tuple[tuple[str, str, Part], ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _FAMILY_NAME.fullmatch(self.name):
            raise FamilyRegistrationError(
                f"family name {self.name!r} must be a non-empty string of letters, digits, '_', '-' or '.'"
            )
        for attr in ("providers", "language_model", "vision_model", "vision_projection", "other", "hf_model_types",
                     "no_full_recompute", "full_recompute_affects"):
            object.__setattr__(self, attr, _string_tuple(self.name, attr, getattr(self, attr)))
        _check_providers(self.name, self.providers)
        unknown = set(self.full_recompute_affects) - {p.value for p in SELECTABLE_PARTS}
        if unknown or bool(self.no_full_recompute) != bool(self.full_recompute_affects):
            raise FamilyRegistrationError(
                f"family {self.name!r}: no_full_recompute and full_recompute_affects go together, and the latter "
                f"names parts ({', '.join(p.value for p in SELECTABLE_PARTS)}); got {sorted(unknown) or 'one alone'}"
            )
        for part in SELECTABLE_PARTS:
            if not self.prefixes(part):
                raise FamilyRegistrationError(
                    f"family {self.name!r} gives no module prefix for {part.value}; every VLM family "
                    "must name its language model, vision encoder and vision projection"
                )
        index = self._index
        for part in (*SELECTABLE_PARTS, Part.OTHER):
            for prefix in self.prefixes(part):
                _check_prefix(self.name, part, prefix)
                if prefix in index and index[prefix] is not part:
                    raise FamilyRegistrationError(
                        f"family {self.name!r}: prefix {prefix!r} is listed under both "
                        f"{index[prefix].value} and {part.value}"
                    )
                index[prefix] = part
        if len(index) <= _MAX_LINEAR_PREFIXES:
            ordered = sorted(index.items(), key=lambda item: len(item[0]), reverse=True)
            object.__setattr__(self, "_ordered", tuple((p, p + ".", part) for p, part in ordered))

    def prefixes(self, part: Part) -> tuple[str, ...]:
        return self.other if part is Part.OTHER else getattr(self, part.value)

    def classify(self, name: str) -> Part | None:
        """The part of one parameter (``None``: under no prefix at all)."""
        if name.startswith(_WRAPPER_PREFIX):
            name = canonical_name(name)
        if self._ordered:
            # Few prefixes (every built-in family): test them longest first; the first that is the
            # name itself or one of its module ancestors is the longest match.
            for prefix, dotted, part in self._ordered:
                if name.startswith(dotted) or name == prefix:
                    return part
            return None
        index = self._index
        # Longest prefix first: walk from the full name up, one module level at a time.
        while True:
            part = index.get(name)
            if part is not None:
                return part
            cut = name.rfind(".")
            if cut < 0:
                return None
            name = name[:cut]

    def resolve_providers(self) -> list[type]:
        """Import and return the provider classes (raises ImportError / AttributeError if stale)."""
        classes = []
        for path in self.providers:
            module, _, qualname = path.partition(":")
            obj: Any = importlib.import_module(module)
            for attr in qualname.split("."):
                obj = getattr(obj, attr)
            classes.append(obj)
        return classes

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "providers": list(self.providers),
            **{part.value: list(self.prefixes(part)) for part in (*SELECTABLE_PARTS, Part.OTHER)},
            "description": self.description,
            "hf_model_types": list(self.hf_model_types),
            "projection_needs_recompute_off": self.projection_needs_recompute_off,
            "recompute_note": self.recompute_note,
            "no_full_recompute": list(self.no_full_recompute),
            "full_recompute_affects": list(self.full_recompute_affects),
            "source": self.source,
        }


class FamilyRegistry:
    """Name-keyed registry of :class:`FamilySpec`; duplicates are refused."""

    def __init__(self) -> None:
        self._families: dict[str, FamilySpec] = {}
        self._by_provider: dict[str, FamilySpec] = {}
        self._lock = threading.RLock()
        #: "module.qualname" -> listener: a reloaded module's listener replaces its old self
        self._listeners: dict[str, Callable[[FamilySpec], None]] = {}
        self._entry_points_loaded = False

    def subscribe(self, listener: Callable[[FamilySpec], None]) -> None:
        """Call ``listener(spec)`` after each later registration (activation patches new providers)."""
        key = f"{getattr(listener, '__module__', '')}.{getattr(listener, '__qualname__', id(listener))}"
        with self._lock:
            self._listeners[key] = listener

    def load_entry_points(self, *, force: bool = False) -> int:
        """Register the families other distributions declare in the ``bridge_freeze_plugin.families`` group.

        Runs once per registry (``force`` re-scans); returns how many families it registered. A broken
        entry point gives a warning naming its distribution and is skipped: it never takes down the run.
        """
        with self._lock:
            if self._entry_points_loaded and not force:
                return 0
            self._entry_points_loaded = True
        return len(_register_entry_points(self))

    def register(self, spec: FamilySpec) -> FamilySpec:
        with self._lock:
            if spec.name in self._families:
                raise FamilyRegistrationError(
                    f"family {spec.name!r} is already registered (by {self._families[spec.name].source}); "
                    "pick another name, or unregister the existing one first"
                )
            for path in spec.providers:
                owner = self._by_provider.get(path)
                if owner is not None:
                    raise FamilyRegistrationError(
                        f"provider {path} is already covered by family {owner.name!r} "
                        f"(registered by {owner.source}); a provider class belongs to one family"
                    )
            self._families[spec.name] = spec
            for path in spec.providers:
                self._by_provider[path] = spec
            listeners = list(self._listeners.values())
        for listener in listeners:
            listener(spec)
        return spec

    def unregister(self, name: str) -> FamilySpec:
        with self._lock:
            spec = self.get(name)
            del self._families[name]
            for path in spec.providers:
                self._by_provider.pop(path, None)
            return spec

    def get(self, name: str) -> FamilySpec:
        try:
            return self._families[name]
        except KeyError:
            raise UnknownFamilyError(
                f"no VLM family named {name!r} is registered; registered families: {', '.join(self.names())}"
            ) from None

    def get_or_none(self, name: str) -> FamilySpec | None:
        return self._families.get(name)

    def names(self) -> list[str]:
        return sorted(self._families)

    def __iter__(self) -> Iterator[FamilySpec]:
        return iter([self._families[n] for n in self.names()])

    def __len__(self) -> int:
        return len(self._families)

    def __contains__(self, name: object) -> bool:
        return name in self._families

    def for_provider_class(self, cls: type) -> FamilySpec | None:
        """The family of a provider class, or of its nearest registered base class."""
        for klass in cls.__mro__:
            spec = self._by_provider.get(class_path(klass))
            if spec is not None:
                return spec
        return None

    def for_provider(self, provider: Any) -> FamilySpec | None:
        cls = provider if isinstance(provider, type) else type(provider)
        return self.for_provider_class(cls)

    def for_hf_model_type(self, model_type: str) -> FamilySpec | None:
        """The family whose checkpoints carry this HF ``model_type`` (``config.json``)."""
        for spec in self:
            if model_type in spec.hf_model_types:
                return spec
        return None

    def find(self, name_or_class: str) -> FamilySpec:
        """A family by family name, provider class name (``Qwen3VLModelProvider``) or class path."""
        if name_or_class in self._families:
            return self._families[name_or_class]
        for path, spec in self._by_provider.items():
            if name_or_class in (path, path.rpartition(":")[2]):
                return spec
        raise UnknownFamilyError(
            f"{name_or_class!r} is neither a registered family nor a provider class of one; "
            f"registered families: {', '.join(self.names())}"
        )


#: The process-wide registry the plugin uses.
REGISTRY = FamilyRegistry()


def register_family(
    name: str,
    *,
    providers: Iterable[str],
    language_model: Iterable[str],
    vision_model: Iterable[str],
    vision_projection: Iterable[str],
    other: Iterable[str] = (),
    description: str = "",
    hf_model_types: Iterable[str] = (),
    projection_needs_recompute_off: bool = False,
    recompute_note: str = "",
    no_full_recompute: Iterable[str] = (),
    full_recompute_affects: Iterable[str] = (),
    source: str = "builtin",
    registry: FamilyRegistry | None = None,
) -> FamilySpec:
    """Register one VLM family in one call. Refuses a duplicate name or provider class."""
    spec = FamilySpec(
        name=name,
        providers=tuple(providers),
        language_model=tuple(language_model),
        vision_model=tuple(vision_model),
        vision_projection=tuple(vision_projection),
        other=tuple(other),
        description=description,
        hf_model_types=tuple(hf_model_types),
        projection_needs_recompute_off=projection_needs_recompute_off,
        recompute_note=recompute_note,
        no_full_recompute=tuple(no_full_recompute),
        full_recompute_affects=tuple(full_recompute_affects),
        source=source,
    )
    return (REGISTRY if registry is None else registry).register(spec)


def list_families(registry: FamilyRegistry | None = None) -> list[FamilySpec]:
    """Every registered family, sorted by name (built-ins and entry-point families alike)."""
    _ensure_builtins()
    return list(REGISTRY if registry is None else registry)


def get_family(name: str) -> FamilySpec:
    _ensure_builtins()
    return REGISTRY.get(name)


def family_for_provider(provider: Any) -> FamilySpec | None:
    """The family of a provider instance or class (subclasses honoured); ``None`` if unknown."""
    _ensure_builtins()
    return REGISTRY.for_provider(provider)


def _ensure_builtins() -> None:
    # Importing the package registers the built-in tables; this keeps direct
    # ``bridge_freeze_plugin.registry`` users correct too.
    importlib.import_module("bridge_freeze_plugin.families")
    REGISTRY.load_entry_points()


#: Entry-point group through which other installed packages register VLM families.
ENTRY_POINT_GROUP = "bridge_freeze_plugin.families"


def _specs_from(obj: Any) -> list[FamilySpec]:
    if callable(obj) and not isinstance(obj, FamilySpec):
        obj = obj()
    if obj is None:
        return []  # the callable registered its families itself
    if isinstance(obj, FamilySpec):
        return [obj]
    specs = list(obj)
    if not all(isinstance(s, FamilySpec) for s in specs):
        raise TypeError("an entry point must give a FamilySpec, a list of them, or a callable returning either")
    return specs


def _register_entry_points(registry: FamilyRegistry) -> list[FamilySpec]:
    import warnings
    from dataclasses import replace
    from importlib.metadata import entry_points

    registered = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else "an unknown distribution"
        try:
            for spec in _specs_from(ep.load()):
                if spec.source == "builtin":
                    spec = replace(spec, source=dist)
                if registry.get_or_none(spec.name) == spec:
                    continue
                registered.append(registry.register(spec))
        except Exception as exc:  # noqa: BLE001 - a third-party bug must not take the run down
            if not is_rank0():  # every rank skips it; rank 0 says so
                continue
            warnings.warn(
                f"bridge-freeze-plugin: the family entry point {ep.name!r} of distribution {dist!r} "
                f"({ep.value}) failed and was skipped: {exc}",
                RuntimeWarning,
                stacklevel=3,
            )
    return registered


def load_entry_point_families(*, force: bool = False) -> int:
    """:meth:`FamilyRegistry.load_entry_points` of the process-wide registry."""
    return REGISTRY.load_entry_points(force=force)
