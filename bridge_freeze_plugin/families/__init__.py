"""Families: which modules of each VLM family are which part, and the registry that holds them.

Each public module here holds data only: ``FAMILIES``, a list of :class:`FamilySpec` (``unsupported`` holds the
Bridge providers no family covers, and why). Importing this package registers every module's ``FAMILIES`` in
:data:`REGISTRY`, once: adding a family is adding a module. The machinery is private, as timm keeps its
``_registry``: :mod:`._spec` (:class:`FamilySpec`, a family's table, checked when made by :mod:`._spec_checks`)
and :mod:`._registry` (:class:`FamilyRegistry`, lookup by name or provider class, entry-point families).

Prefixes name modules as a pre-wrap hook sees them on a bare model chunk (no ``module.``).
Each table covers its whole model: a parameter the table does not cover makes a freeze fail
loudly (``UnclassifiedParameterError``) rather than train or freeze by accident.
"""

from __future__ import annotations

import importlib
import pkgutil

from bridge_freeze_plugin.families._registry import (
    ENTRY_POINT_GROUP,
    REGISTRY,
    FamilyRegistry,
    FamilySpec,
    OfflineConfig,
    ProviderLayout,
    canonical_name,
    class_path,
    family_for_provider,
    get_family,
    list_families,
    load_entry_point_families,
    register_family,
)
from bridge_freeze_plugin.families.unsupported import UNSUPPORTED_PROVIDERS
from bridge_freeze_plugin.request import use_family_source


def _builtin_families() -> tuple[FamilySpec, ...]:
    specs: list[FamilySpec] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):  # the machinery, not a family module
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        specs.extend(getattr(module, "FAMILIES", ()))
    return tuple(specs)


BUILTIN_FAMILIES: tuple[FamilySpec, ...] = _builtin_families()

for _spec in BUILTIN_FAMILIES:
    if _spec.name not in REGISTRY:
        REGISTRY.register(_spec)

# FreezeSelection.untrained_parts() without a family's prefixes asks every registered family.
use_family_source(list_families)

__all__ = [
    "BUILTIN_FAMILIES",
    "ENTRY_POINT_GROUP",
    "REGISTRY",
    "UNSUPPORTED_PROVIDERS",
    "FamilyRegistry",
    "FamilySpec",
    "OfflineConfig",
    "ProviderLayout",
    "canonical_name",
    "class_path",
    "family_for_provider",
    "get_family",
    "list_families",
    "load_entry_point_families",
    "register_family",
]
