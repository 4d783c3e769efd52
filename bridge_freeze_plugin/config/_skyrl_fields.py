"""SkyRL's config classes as data: every field of every section, from the installed release or a committed listing.

SkyRL (``skyrl``, the released trainer) configures a run with dataclasses (``skyrl/train/config/config.py``:
``SkyRLTrainConfig`` for RL, ``sft_config.py``: ``SFTConfig``), overridden on the command line. Its loader builds
them section by section and refuses any key that is no field of the section's class (``ValueError: Invalid fields
{...} for MegatronConfig``); a field typed as a free mapping (``transformer_config_kwargs``) takes any key. This
module reads those classes into a plain listing: class -> field -> the field's section class, or ``None`` (a value
or a free mapping, never walked).

Where the listing comes from (:func:`current`): ``BRIDGE_FREEZE_SKYRL_FIELDS`` (a listing file written by
``scripts/gen_skyrl_fields.py`` from the SkyRL you run, or ``none``: no listing, for a SkyRL carrying the review's
``megatron_config.freeze_*`` fields that is not importable here); else the installed ``skyrl``'s own classes; else
the listing committed next to this module (``skyrl_fields.json``, with the version it was generated from).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
import json
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge_freeze_plugin.errors import ConfigLoadError

#: The environment variable naming the listing to read (a path, or ``none``).
ENV = "BRIDGE_FREEZE_SKYRL_FIELDS"
#: The listing committed with the plugin (regenerate: ``python scripts/gen_skyrl_fields.py``).
COMMITTED = Path(__file__).with_name("skyrl_fields.json")
#: The free mapping of ``MegatronConfig`` that SkyRL's worker sets, item by item, on the model provider.
KWARGS = "transformer_config_kwargs"
#: layout name -> (module, class) of the root config class SkyRL's loader builds for it.
ROOTS: Mapping[str, tuple[str, str]] = {
    "rl": ("skyrl.train.config.config", "SkyRLTrainConfig"),
    "sft": ("skyrl.train.config.sft_config", "SFTConfig"),
}
#: The review's flag fields: a SkyRL whose ``MegatronConfig`` has them reads ``megatron_config.freeze_*`` as flags.
REVIEW_FIELDS = ("freeze_language_model", "freeze_vision_model", "freeze_vision_projection")


@dataclass(frozen=True)
class SkyRLFields:
    """The fields of one SkyRL's config classes (class ids are ``module.Class``)."""

    version: str
    #: where the listing came from, in words (said in check-config's summary and in every refusal)
    source: str
    #: layout name -> the id of its root class
    roots: Mapping[str, str]
    #: class id -> field name -> the id of the field's section class (``None``: a value or a free mapping)
    classes: Mapping[str, Mapping[str, str | None]]
    #: enum id -> its members' values (a field typed as an enum: PyYAML dumps it as a Python tag over its value)
    enums: Mapping[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    #: read from the installed skyrl's own classes (then its loader's own code can run: :mod:`._skyrl_loader`)
    installed: bool = False

    def fields(self, cls: str) -> Mapping[str, str | None]:
        return self.classes[cls]

    @staticmethod
    def name(cls: str) -> str:
        return cls.rpartition(".")[2]

    def section_class(self, layout: str, path: str) -> str | None:
        """The class of the section at dotted ``path`` (from the layout's root), ``None`` when it is none."""
        cls: str | None = self.roots[layout]
        for part in [p for p in path.split(".") if p]:
            if cls is None:
                return None
            cls = self.fields(cls).get(part)
        return cls

    def accepts(self, layout: str, key: str) -> bool:
        """Whether SkyRL's loader accepts the dotted ``key`` (every level a field; below a free mapping: any)."""
        cls: str | None = self.roots[layout]
        for part in key.split("."):
            if cls is None:
                return True
            if part not in self.fields(cls):
                return False
            cls = self.fields(cls)[part]
        return True

    def has_review_fields(self, layout: str, megatron: str) -> bool:
        """Whether the ``MegatronConfig`` at ``megatron`` has the review's flag fields (a SkyRL carrying them)."""
        cls = self.section_class(layout, megatron)
        return cls is not None and all(name in self.fields(cls) for name in REVIEW_FIELDS)

    def as_json(self) -> dict[str, Any]:
        return {"skyrl_version": self.version, "roots": dict(self.roots),
                "classes": {k: dict(v) for k, v in sorted(self.classes.items())},
                "enums": {k: list(v) for k, v in sorted(self.enums.items())}}


def _section_type(annotation: Any) -> type | None:
    """The dataclass a field's annotation holds (``X``, ``Optional[X]``, ``Annotated[X, ...]``), or ``None``."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _section_type(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        found = [t for a in typing.get_args(annotation) if a is not type(None) and (t := _section_type(a))]
        return found[0] if found else None
    return annotation if isinstance(annotation, type) and dataclasses.is_dataclass(annotation) else None


def _enum_type(annotation: Any) -> type[enum.Enum] | None:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated or origin is typing.Union or origin is types.UnionType:
        found = [t for a in typing.get_args(annotation) if (t := _enum_type(a))]
        return found[0] if found else None
    return annotation if isinstance(annotation, type) and issubclass(annotation, enum.Enum) else None


def _cls_id(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _listing_from_classes(roots: Mapping[str, type], version: str, source: str) -> SkyRLFields:
    """The listing of ``roots`` (layout name -> root dataclass) and every section class below them."""
    classes: dict[str, dict[str, str | None]] = {}
    enums: dict[str, tuple[Any, ...]] = {}
    todo = list(roots.values())
    while todo:
        cls = todo.pop()
        if _cls_id(cls) in classes:
            continue
        try:
            hints = typing.get_type_hints(cls, include_extras=True)
        except Exception:  # noqa: BLE001 - an annotation that does not resolve here: read it as written
            hints = {}
        out: dict[str, str | None] = {}
        for f in dataclasses.fields(cls):
            section = _section_type(hints.get(f.name, f.type))
            if (kind := _enum_type(hints.get(f.name, f.type))) is not None:
                enums[_cls_id(kind)] = tuple(member.value for member in kind)
            out[f.name] = None if section is None else _cls_id(section)
            if section is not None:
                todo.append(section)
        classes[_cls_id(cls)] = out
    return SkyRLFields(version, source, {name: _cls_id(cls) for name, cls in roots.items()}, classes, enums)


def from_installed() -> tuple[SkyRLFields | None, str]:
    """The installed ``skyrl``'s listing, or ``None`` and why not."""
    try:
        roots = {name: getattr(importlib.import_module(module), cls) for name, (module, cls) in ROOTS.items()}
        from importlib.metadata import version

        release = version("skyrl")
    except Exception as exc:  # noqa: BLE001 - any failure to import it: not importable here, said in the source
        return None, f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
    listing = _listing_from_classes(roots, release, f"the installed skyrl {release}'s config classes")
    return dataclasses.replace(listing, installed=True), ""


def _from_listing(path: str | os.PathLike[str], source: str | None = None) -> SkyRLFields:
    """A listing file written by ``scripts/gen_skyrl_fields.py``."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        version, roots, classes = data["skyrl_version"], data["roots"], data["classes"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigLoadError(f"cannot read the SkyRL field listing {path} ({type(exc).__name__}: {exc}); write "
                              "one with: python scripts/gen_skyrl_fields.py --out FILE") from exc
    if set(roots) != set(ROOTS) or any(cls not in classes for cls in roots.values()):
        raise ConfigLoadError(f"the SkyRL field listing {path} lacks the root classes {sorted(ROOTS)}; regenerate "
                              "it with scripts/gen_skyrl_fields.py")
    enums = {k: tuple(v) for k, v in data.get("enums", {}).items()}
    return SkyRLFields(version, source or f"the listing {path} (skyrl {version})", roots, classes, enums)


@functools.lru_cache(maxsize=1)
def _installed_or_committed() -> SkyRLFields:
    installed, why = from_installed()
    if installed is not None:
        return installed
    listing = _from_listing(COMMITTED)
    return dataclasses.replace(listing, source=(
        f"the plugin's listing of skyrl {listing.version}'s config classes (bridge_freeze_plugin/config/"
        f"{COMMITTED.name}; skyrl is not importable here: {why})"))


def current() -> SkyRLFields | None:
    """The SkyRL fields a SkyRL config is checked against; ``None`` when ``BRIDGE_FREEZE_SKYRL_FIELDS=none``."""
    named = os.environ.get(ENV, "").strip()
    if named.lower() == "none":
        return None
    if named:
        return _from_listing(named, f"the listing {named} named by {ENV}")
    return _installed_or_committed()


def known_enums() -> Mapping[str, tuple[Any, ...]]:
    """The enums of SkyRL's config classes (the SkyRL here, and the committed listing's): their dumps' tags."""
    here = current()
    committed = _installed_or_committed().enums
    return {**committed, **(here.enums if here is not None else {})}
