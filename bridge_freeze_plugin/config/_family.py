"""Which model family a config is for: the caller's, a local checkpoint's ``model_type``, a guess from the model's
name, or a provider class path (:func:`config_family`: the reading's family stage)."""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from bridge_freeze_plugin.config._layouts import Layout
from bridge_freeze_plugin.config._values import select
from bridge_freeze_plugin.errors import UnknownFamilyError
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.registry import REGISTRY

logger = logging.getLogger("bridge_freeze_plugin")


def family_arg(family: FamilySpec | str | None) -> FamilySpec | None:
    """``family`` as a :class:`FamilySpec` (a family name or a provider class name, looked up in the registry)."""
    if family is None or isinstance(family, FamilySpec):
        return family
    return REGISTRY.find(family)


def config_family(cfg: Any, layout: Layout, family: FamilySpec | str | None) -> tuple[FamilySpec | None, str | None]:
    """The config's family and how it was found: ``family`` (named by the caller), else the model path's
    ``config.json`` (``model_type``), else a guess from the model's name where the layout allows one, else the
    provider class (``_target_``); ``(None, None)`` when nothing names one."""
    try:
        target = select(cfg, layout.model.provider_target) if layout.model.provider_target else None
    except Exception:  # noqa: BLE001 - a malformed target is reported by the reading; here it only names no family
        target = None
    resolved, source = family_arg(family), "named by the caller"
    if resolved is None and layout.model.path is not None:
        model_path = select(cfg, layout.model.path)
        resolved = family_from_model_path(model_path) if isinstance(model_path, str) else None
        source = f"{layout.model.path}'s config.json (model_type)"
        if resolved is None and layout.model.family_from_name and isinstance(model_path, str):
            resolved = family_from_name(model_path)
            source = (f"{layout.model.path}={model_path}: a guess from the name (no local config.json to read; "
                      "--family NAME to be sure)")
    if resolved is None and target is not None:
        resolved = family_from_target(str(target))
        source = f"{layout.model.provider_target} (the provider class)"
    return resolved, source if resolved is not None else None


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


def _normalised(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def family_from_name(name: str | None) -> FamilySpec | None:
    """A family guessed from a model's name (a hub id such as ``Qwen/Qwen2.5-VL-3B-Instruct``, or a path's last
    segment), without downloading anything; ``None`` when no family matches, or two match equally well.

    A family matches when one of its HF ``model_type`` values (``qwen2_5_vl``), or every word of its name
    (``nemotron`` and ``omni``), appears in the name with case, dashes, dots and underscores ignored; the longest
    match wins. It is a guess (``Qwen3-VL-30B-A3B`` reads as ``qwen3_vl``, not its MoE sibling): say so.
    """
    if not isinstance(name, str) or not name.strip():
        return None
    text = _normalised(name.rstrip("/").rpartition("/")[2])
    best: dict[int, set[str]] = {}
    families = {family.name: family for family in REGISTRY}
    for family in families.values():
        keys = [_normalised(t) for t in family.hf_model_types]
        score = max((len(k) for k in keys if k and k in text), default=0)
        words = [_normalised(w) for w in family.name.split("_") if w]
        if words and all(w in text for w in words):
            score = max(score, sum(len(w) for w in words))
        if score:
            best.setdefault(score, set()).add(family.name)
    if not best:
        return None
    top = best[max(best)]
    return families[next(iter(top))] if len(top) == 1 else None


#: The only modules a config's ``_target_`` may make this process import: Megatron-Bridge's own (its providers).
#: Anything else is compared by name against the registry, never imported: a config must not run code.
_IMPORTABLE = "megatron.bridge."
def _decoded(target: str) -> str | None:
    """The provider class path (``module:QualName``) a generated freezable subclass name encodes, if it is one
    (the plugin's generated freezable subclasses, ``make_freezable``: under their module, or one an earlier version
    wrote)."""
    from bridge_freeze_plugin.mixins import (
        FORMER_MODULES,
        GENERATED_CLASS_PREFIX,
        GENERATED_MODULE,
        decode_class_path,
    )

    module, _, name = target.rpartition(".")
    if module not in (GENERATED_MODULE, *FORMER_MODULES):
        return None
    _, sep, token = name.rpartition("_x")
    return decode_class_path(token) if name.startswith(GENERATED_CLASS_PREFIX) and sep else None


def family_from_target(target: str) -> FamilySpec | None:
    """The family of a provider class path as Bridge writes it (``pkg.module.ClassName``), without importing it.

    Names are compared with the registry's provider classes; a generated freezable subclass
    (``bridge_freeze_plugin.mixins.freezable.Freezable...``, or a former module's) is read as the provider class
    its name encodes.
    """
    decoded = _decoded(target)
    if decoded is not None:
        try:
            return REGISTRY.find(decoded)
        except UnknownFamilyError:
            return None
    module, _, name = target.rpartition(".")
    try:
        return REGISTRY.find(f"{module}:{name}")
    except UnknownFamilyError:
        return None


def importable_target(target: str) -> str | None:
    """The dotted class path a ``_target_`` may be imported as, or ``None`` (with the reason logged).

    Only Megatron-Bridge's own modules, and only a path Bridge's own ``_target_`` rules would accept: dotted
    identifiers, no private segment (``_x``). A generated freezable subclass stands for the class it encodes.
    """
    decoded = _decoded(target)
    dotted = decoded.replace(":", ".") if decoded is not None else target
    segments = dotted.split(".")
    if not dotted.startswith(_IMPORTABLE) or not all(s.isidentifier() for s in segments) or any(
            s.startswith("_") for s in segments):
        logger.debug("bridge-freeze: not importing %r: a config's _target_ is imported only from Megatron-Bridge's "
                     "own modules (%s*), never other code", target, _IMPORTABLE)
        return None
    return dotted


def import_target(target: str) -> type | None:
    """The provider class a ``_target_`` names, or ``None`` when it cannot (or may not) be imported here.

    Imports nothing outside Megatron-Bridge's own modules (:func:`importable_target`): a config must never make
    this process run code of its choosing. Whatever the import prints goes to stderr (stdout is the result).
    """
    dotted = importable_target(target)
    if dotted is None:
        return None
    module, _, name = dotted.rpartition(".")
    try:
        with contextlib.redirect_stdout(sys.stderr):
            found = getattr(importlib.import_module(module), name, None)
    except Exception as exc:  # noqa: BLE001 - any import failure means "cannot tell here"
        logger.debug("bridge-freeze: cannot import %s: %s", dotted, exc)
        return None
    return found if isinstance(found, type) else None
