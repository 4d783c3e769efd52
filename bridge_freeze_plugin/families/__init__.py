"""Families: which modules of each VLM family are which part, as data.

Each public module here holds data only: ``FAMILIES``, a list of :class:`FamilySpec` (``unsupported`` holds the
Bridge providers no family covers, and why). Importing this package collects every module's ``FAMILIES`` into
:data:`BUILTIN_FAMILIES`: adding a family is adding a module. The registry that holds them, looks them up and adds
other packages' families is :mod:`bridge_freeze_plugin.registry` (it registers these when it is imported). The
table's type is private, as timm keeps its machinery: :mod:`._spec` (:class:`FamilySpec`, checked when made by
:mod:`._spec_checks`).

Prefixes name modules as a pre-wrap hook sees them on a bare model chunk (no ``module.``).
Each table covers its whole model: a parameter the table does not cover makes a freeze fail
loudly (``UnclassifiedParameterError``) rather than train or freeze by accident.
"""

from __future__ import annotations

import importlib
import pkgutil

from bridge_freeze_plugin.families._spec import FamilySpec, OfflineConfig, ProviderLayout, canonical_name, class_path
from bridge_freeze_plugin.families.unsupported import UNSUPPORTED_PROVIDERS


def _builtin_families() -> tuple[FamilySpec, ...]:
    specs: list[FamilySpec] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):  # the machinery, not a family module
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        specs.extend(getattr(module, "FAMILIES", ()))
    return tuple(specs)


BUILTIN_FAMILIES: tuple[FamilySpec, ...] = _builtin_families()

__all__ = [
    "BUILTIN_FAMILIES",
    "UNSUPPORTED_PROVIDERS",
    "FamilySpec",
    "OfflineConfig",
    "ProviderLayout",
    "canonical_name",
    "class_path",
]
