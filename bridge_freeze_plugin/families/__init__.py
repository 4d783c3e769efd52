"""Built-in family tables: one :class:`~bridge_freeze_plugin.registry.FamilySpec` per VLM family.

Each module here holds data only: ``FAMILIES``, a list of specs (``unsupported`` holds the Bridge
providers no family covers, and why). Importing this package registers every module's ``FAMILIES`` in
:data:`bridge_freeze_plugin.registry.REGISTRY`, once: adding a family is adding a module.

Prefixes name modules as a pre-wrap hook sees them on a bare model chunk (no ``module.``).
Each table covers its whole model: a parameter the table does not cover makes a freeze fail
loudly (``UnclassifiedParameterError``) rather than train or freeze by accident.
"""

from __future__ import annotations

import importlib
import pkgutil

from bridge_freeze_plugin.registry import REGISTRY, FamilySpec, list_families
from bridge_freeze_plugin.request import use_family_source


def _builtin_families() -> tuple[FamilySpec, ...]:
    specs: list[FamilySpec] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        specs.extend(getattr(module, "FAMILIES", ()))
    return tuple(specs)


BUILTIN_FAMILIES: tuple[FamilySpec, ...] = _builtin_families()

for _spec in BUILTIN_FAMILIES:
    if _spec.name not in REGISTRY:
        REGISTRY.register(_spec)

# FreezeSelection.untrained_parts() without a family's prefixes asks every registered family.
use_family_source(list_families)
