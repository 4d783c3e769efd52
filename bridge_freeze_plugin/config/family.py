"""Which model family a config is for: a local checkpoint's ``model_type``, or a provider class path."""

from __future__ import annotations

import importlib
import json
import logging
import os
from pathlib import Path

from bridge_freeze_plugin.errors import UnknownFamilyError
from bridge_freeze_plugin.registry import REGISTRY, FamilySpec

logger = logging.getLogger("bridge_freeze_plugin")


def family_from_model_path(path: str | os.PathLike[str] | None) -> FamilySpec | None:
    """The family of a local checkpoint (a directory with ``config.json``, or that file), by HF ``model_type``.

    ``None`` for a hub id, a missing path, an unreadable config or an unregistered ``model_type``.
    """
    if path is None or (isinstance(path, str) and not path):
        return None
    candidate = Path(os.path.expanduser(os.fspath(path)))
    config_file = candidate / "config.json" if candidate.is_dir() else candidate
    if not config_file.is_file() or config_file.suffix != ".json":
        return None
    try:
        model_type = json.loads(config_file.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError) as exc:
        logger.debug("bridge-freeze: cannot read model_type from %s: %s", config_file, exc)
        return None
    return REGISTRY.for_hf_model_type(model_type) if isinstance(model_type, str) else None


def family_from_target(target: str) -> FamilySpec | None:
    """The family of a provider class path as Bridge writes it (``pkg.module.ClassName``), without importing it."""
    module, _, name = target.rpartition(".")
    try:
        return REGISTRY.find(f"{module}:{name}")
    except UnknownFamilyError:
        return None


def import_target(target: str) -> type | None:
    """The provider class a ``_target_`` names, or ``None`` when it cannot be imported here."""
    module, _, name = target.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name, None)
    except Exception as exc:  # noqa: BLE001 - any import failure means "cannot tell here"
        logger.debug("bridge-freeze: cannot import %s: %s", target, exc)
        return None
    return found if isinstance(found, type) else None
