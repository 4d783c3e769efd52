"""The family registry: which module prefixes make up each part of each VLM family.

One of the design's two homes (the other is :mod:`bridge_freeze_plugin.mixins`). Family knowledge is data
(:class:`FamilySpec`, one per family, in the family's own module under :mod:`bridge_freeze_plugin.families`);
everything here is generic. Importing this module registers the built-in tables
(:data:`~bridge_freeze_plugin.families.BUILTIN_FAMILIES`) in :data:`REGISTRY`, once; other installed packages
add theirs through the ``bridge_freeze_plugin.families`` entry-point group, read on the first lookup. Provider
classes are named by import path (``"package.module:Class"``) and are only compared by name, so listing or looking
up families imports no model code.

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

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from bridge_freeze_plugin.errors import FamilyRegistrationError, UnknownFamilyError
from bridge_freeze_plugin.families import (
    BUILTIN_FAMILIES,
    UNSUPPORTED_PROVIDERS,
    FamilySpec,
    class_path,
)
from bridge_freeze_plugin.ranks import is_rank0
from bridge_freeze_plugin.request import use_family_source

__all__ = [
    "ENTRY_POINT_GROUP",
    "REGISTRY",
    "FamilyRegistry",
    "family_for_provider",
    "get_family",
    "list_families",
    "load_entry_point_families",
    "register_family",
]

class FamilyRegistry:
    """Name-keyed registry of :class:`FamilySpec`; a second claim on a name, provider class or HF model type is
    refused, naming the family that holds it."""

    def __init__(self) -> None:
        self._families: dict[str, FamilySpec] = {}
        self._by_provider: dict[str, FamilySpec] = {}
        self._by_hf_model_type: dict[str, FamilySpec] = {}
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
                        f"family {spec.name!r}: provider {path} is already covered by family {owner.name!r} "
                        f"(registered by {owner.source}); a provider class belongs to one family: drop it from "
                        f"{spec.name!r}'s providers, or unregister {owner.name!r} first"
                    )
            for model_type in spec.hf_model_types:
                owner = self._by_hf_model_type.get(model_type)
                if owner is not None:
                    raise FamilyRegistrationError(
                        f"family {spec.name!r}: HF model type {model_type!r} is already claimed by family "
                        f"{owner.name!r} (registered by {owner.source}); a checkpoint's config.json model_type must "
                        f"name one family: drop it from {spec.name!r}'s hf_model_types, or unregister "
                        f"{owner.name!r} first"
                    )
            self._families[spec.name] = spec
            for path in spec.providers:
                self._by_provider[path] = spec
            for model_type in spec.hf_model_types:
                self._by_hf_model_type[model_type] = spec
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
            for model_type in spec.hf_model_types:
                self._by_hf_model_type.pop(model_type, None)
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
        """The family of a provider class, or of its nearest registered base class; ``None`` where a class refused by
        name (``families/unsupported.py``) comes first (a text-only subclass of a VLM family's provider)."""
        for klass in cls.__mro__:
            if class_path(klass) in UNSUPPORTED_PROVIDERS:
                return None
            spec = self._by_provider.get(class_path(klass))
            if spec is not None:
                return spec.for_class(cls)  # the table this class builds (a family may have several)
        return None

    def for_provider(self, provider: Any) -> FamilySpec | None:
        cls = provider if isinstance(provider, type) else type(provider)
        return self.for_provider_class(cls)

    def for_hf_model_type(self, model_type: str) -> FamilySpec | None:
        """The family whose checkpoints carry this HF ``model_type`` (``config.json``); one at most."""
        return self._by_hf_model_type.get(model_type)

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
for _builtin in BUILTIN_FAMILIES:
    REGISTRY.register(_builtin)


def register_family(
    name: str,
    *,
    providers: Iterable[str],
    language_model: Iterable[str],
    vision_model: Iterable[str] = (),
    vision_projection: Iterable[str] = (),
    parts: Mapping[str, Iterable[str]] | None = None,
    other: Iterable[str] = (),
    description: str = "",
    hf_model_types: Iterable[str] = (),
    recompute_note: str = "",
    no_full_recompute: Iterable[str] = (),
    full_recompute_affects: Iterable[str] = (),
    plain_linear: Iterable[str] = (),
    linear_leaves: Mapping[str, Iterable[str]] | None = None,
    source: str = "builtin",
    registry: FamilyRegistry | None = None,
) -> FamilySpec:
    """Register one model family in one call: the module prefixes of each of its parts (keywords for the
    vision-language parts, ``parts={"audio_model": [...], ...}`` for any part of the vocabulary).

    Refuses a duplicate name, a provider class or HF model type another family already claims, and a string where
    a list is expected (``language_model="language_model"``): every argument is checked by :class:`FamilySpec`.
    """
    spec = FamilySpec(
        name=name,
        providers=providers,  # type: ignore[arg-type]  # FamilySpec checks and converts every sequence
        language_model=language_model,  # type: ignore[arg-type]
        vision_model=vision_model,  # type: ignore[arg-type]
        vision_projection=vision_projection,  # type: ignore[arg-type]
        parts=parts or {},
        other=other,  # type: ignore[arg-type]
        description=description,
        hf_model_types=hf_model_types,  # type: ignore[arg-type]
        recompute_note=recompute_note,
        no_full_recompute=no_full_recompute,  # type: ignore[arg-type]
        full_recompute_affects=full_recompute_affects,  # type: ignore[arg-type]
        plain_linear=plain_linear,  # type: ignore[arg-type]
        linear_leaves=linear_leaves or {},
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
    # The built-in tables were registered when this module was imported: only the entry points may be new.
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


# FreezeSelection.untrained_parts() without a family's prefixes asks every registered family.
use_family_source(list_families)
