"""One VLM family as data: :class:`FamilySpec`, the module prefixes of each part, checked when it is made.

A prefix names a module as a bare model chunk's ``named_parameters()`` spells it; a parameter belongs to the
part with the longest matching prefix. :mod:`bridge_freeze_plugin.families._registry` holds the registered specs.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from bridge_freeze_plugin.errors import FamilyRegistrationError
from bridge_freeze_plugin.request import REQUIRED_PARTS, SELECTABLE_PARTS, Part, label

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


#: The fields that hold a sequence of strings (a provider may also be given as a class).
SEQUENCE_FIELDS = ("providers", "language_model", "vision_model", "vision_projection", "other", "hf_model_types",
                   "no_full_recompute", "full_recompute_affects")
#: The parts with a keyword of their own (the vision-language parts); any part may be given in ``parts=``.
_KEYWORD_PARTS = ("language_model", "vision_model", "vision_projection")
#: The fields that hold one string.
TEXT_FIELDS = ("description", "recompute_note", "source")


def _string_tuple(family: Any, attr: str, value: Any) -> tuple[str, ...]:
    """``value`` as a tuple of strings (a provider class object is written as its import path).

    A ``str`` (or ``bytes``) is refused rather than split into single letters, a mapping rather than read for its
    keys, and so is an empty string in the list.
    """
    example = "['package.module:ClassName']" if attr == "providers" else "['language_model']"
    if isinstance(value, str | bytes | bytearray | memoryview):
        kind = "string" if isinstance(value, str) else type(value).__name__
        raise FamilyRegistrationError(
            f"family {family!r}: {attr} must be a list of strings, e.g. {example}, not the {kind} {value!r} (which "
            f"would be read one letter at a time); write {attr}=[{value!r}] (a one-element tuple needs a trailing "
            f"comma: ({value!r},))"
        )
    if isinstance(value, Mapping) or not isinstance(value, Iterable):
        raise FamilyRegistrationError(
            f"family {family!r}: {attr} must be a list of strings, e.g. {example}, not {type(value).__name__} "
            f"{value!r}"
        )
    items = []
    for item in value:
        if attr == "providers" and isinstance(item, type):
            item = class_path(item)
        if not isinstance(item, str) or not item:
            what = "'package.module:ClassName' strings or classes" if attr == "providers" else "non-empty strings"
            raise FamilyRegistrationError(
                f"family {family!r}: {attr} must hold {what}, got {type(item).__name__} {item!r} in {value!r}"
            )
        items.append(item)
    return tuple(items)


def _check_scalars(spec: Any) -> None:
    for attr in TEXT_FIELDS:
        value = getattr(spec, attr)
        if not isinstance(value, str):
            raise FamilyRegistrationError(
                f"family {spec.name!r}: {attr} must be a string, not {type(value).__name__} {value!r}"
            )


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
class ProviderLayout:
    """Another layout of a family's parts, for one provider class and its subclasses.

    A family whose provider classes build different module trees (Nemotron Omni on Bridge 0.7.0: top-level
    parts on ``NemotronOmniModelProvider``, ``llava_model.*`` on the legacy ``NemotronOmniLlavaModelProvider``)
    gives each its table here; a provider of no listed class uses the family's own table. ``parts`` maps every
    part the layout has to its prefixes (the family's ``other`` is kept). ``when_field``: the layout applies
    only to a provider class that has this dataclass field (the Bridge version that builds that tree declares
    it, an older one with the same class name does not).
    """

    provider: str
    parts: Any
    when_field: str = ""
    description: str = ""


@dataclass(frozen=True)
class FamilySpec:
    """One model family: the provider classes it covers and the module prefixes of each of its parts.

    A prefix names a module (``"visual.merger"``) and covers every parameter below it. A parameter
    belongs to the part with the longest (most specific) matching prefix, so a projection that
    lives inside the vision module (``visual.merger`` inside ``visual``) is the projection.

    The vision-language parts have keywords (``language_model=``, ``vision_model=``, ``vision_projection=``);
    ``parts=`` maps any part of the vocabulary (:mod:`bridge_freeze_plugin.request._parts`) to its prefixes, e.g.
    ``parts={"audio_model": ("audio_tower",), "audio_projection": ("embed_audio",)}``. Every family has a language
    model and at least one other part; a part with no prefix is one the family does not have (a flag set for it
    is refused). ``other`` lists known modules that belong to no part (a talker, say): no flag touches them, and
    the report shows them on their own line.
    """

    name: str
    providers: tuple[str, ...]
    language_model: tuple[str, ...] = ()
    vision_model: tuple[str, ...] = ()
    vision_projection: tuple[str, ...] = ()
    other: tuple[str, ...] = ()
    #: Part name -> prefixes, for any part of the vocabulary (stored as sorted ``(part, prefixes)`` pairs).
    parts: Any = ()
    description: str = ""
    #: HF ``config.json`` ``model_type`` values of this family (to recognise a checkpoint or config).
    hf_model_types: tuple[str, ...] = ()
    #: Why, in one clause a message can quote (family knowledge stays in the family's table).
    recompute_note: str = ""
    #: Modules (prefixes) whose full activation recompute gives wrong gradients: the plugin turns recompute off
    #: in their configs when one of ``full_recompute_affects`` trains under full recompute.
    no_full_recompute: tuple[str, ...] = ()
    #: The parts whose gradients that recompute gets wrong (their training triggers the fix).
    full_recompute_affects: tuple[str, ...] = ()
    #: Who registered it: "builtin", or the distribution that provided an entry point.
    source: str = "builtin"
    #: Other tables for some provider classes (:class:`ProviderLayout`); :meth:`for_class` picks one.
    layouts: tuple[ProviderLayout, ...] = ()
    #: one spec per layout, in order (made and checked when the family is made)
    _variants: tuple[FamilySpec, ...] = field(default=(), init=False, repr=False, compare=False)
    _index: dict[str, Part] = field(default_factory=dict, init=False, repr=False, compare=False)
    #: part -> prefixes, every part of the vocabulary (empty: the family does not have it).
    _prefixes: dict[Part, tuple[str, ...]] = field(default_factory=dict, init=False, repr=False, compare=False)
    #: (prefix, prefix + ".", part), longest prefix first: the fast path of :meth:`classify`.
    _ordered: tuple[tuple[str, str, Part], ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _FAMILY_NAME.fullmatch(self.name):
            raise FamilyRegistrationError(
                f"family name {self.name!r} must be a non-empty string of letters, digits, '_', '-' or '.'"
            )
        for attr in SEQUENCE_FIELDS:
            object.__setattr__(self, attr, _string_tuple(self.name, attr, getattr(self, attr)))
        _check_scalars(self)
        _check_providers(self.name, self.providers)
        unknown = set(self.full_recompute_affects) - {p.value for p in SELECTABLE_PARTS}
        if unknown or bool(self.no_full_recompute) != bool(self.full_recompute_affects):
            raise FamilyRegistrationError(
                f"family {self.name!r}: no_full_recompute and full_recompute_affects go together, and the latter "
                f"names parts ({', '.join(p.value for p in SELECTABLE_PARTS)}); got {sorted(unknown) or 'one alone'}"
            )
        self._merge_parts()
        missing = [p for p in REQUIRED_PARTS if not self._prefixes[p]]
        if missing or len(self.part_names()) < 2:
            what = ", ".join(p.value for p in missing) or "any part besides the language model"
            raise FamilyRegistrationError(
                f"family {self.name!r} gives no module prefix for {what}; every family names its language model "
                f"(language_model=...) and at least one more part ({', '.join(p.value for p in SELECTABLE_PARTS[1:])}"
                f"; keywords for the vision parts, parts={{...}} for any)"
            )
        index = self._index
        for part in (*self.part_names(), Part.OTHER):
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
        self._make_variants()

    def _make_variants(self) -> None:
        """One spec per :class:`ProviderLayout`: this family with the layout's table, checked as any family."""
        layouts = tuple(self.layouts)
        if not all(isinstance(layout, ProviderLayout) for layout in layouts):
            raise FamilyRegistrationError(
                f"family {self.name!r}: layouts must hold ProviderLayout(provider=..., parts={{...}}), got {layouts!r}")
        object.__setattr__(self, "layouts", layouts)
        variants = []
        for layout in layouts:
            _check_providers(self.name, (layout.provider,))
            described = f"{self.description} [{layout.provider.rpartition(':')[2]}: {layout.description}]"
            variants.append(replace(self, language_model=(), vision_model=(), vision_projection=(),
                                    parts=layout.parts, layouts=(), description=described))
        object.__setattr__(self, "_variants", tuple(variants))

    def for_class(self, cls: type) -> FamilySpec:
        """The table a provider of class ``cls`` builds: the layout of its nearest listed class, else this one."""
        if not self.layouts:
            return self
        declared = getattr(cls, "__dataclass_fields__", {})
        for klass in cls.__mro__:
            path = class_path(klass)
            for layout, variant in zip(self.layouts, self._variants, strict=True):
                if layout.provider == path and (not layout.when_field or layout.when_field in declared):
                    return variant
        return self

    def _merge_parts(self) -> None:
        """``parts=`` and the keywords as one table (a part given both ways is refused)."""
        given = self.parts
        if isinstance(given, Mapping):
            given = given.items()
        elif isinstance(given, str | bytes) or not isinstance(given, Iterable):
            raise FamilyRegistrationError(
                f"family {self.name!r}: parts must map part names to prefixes, e.g. "
                f"parts={{'audio_model': ['audio_tower']}}, not {type(given).__name__} {given!r}")
        table: dict[Part, tuple[str, ...]] = {p: () for p in SELECTABLE_PARTS}
        for item in given:
            if not (isinstance(item, tuple | list) and len(item) == 2):
                raise FamilyRegistrationError(
                    f"family {self.name!r}: parts must map part names to prefixes, got the item {item!r}")
            key, prefixes = item
            if str(key) not in {p.value for p in SELECTABLE_PARTS}:
                raise FamilyRegistrationError(
                    f"family {self.name!r}: parts names {key!r}, which is not a part; the parts are "
                    f"{', '.join(p.value for p in SELECTABLE_PARTS)} (and other=... for modules no flag touches)")
            part = Part(str(key))
            table[part] = _string_tuple(self.name, f"parts[{part.value!r}]", prefixes)
            # The same prefixes both ways is one table given twice (what dataclasses.replace() passes
            # back in, since the merged table is kept in ``parts``); different ones are a conflict.
            keyword = getattr(self, part.value) if part.value in _KEYWORD_PARTS else ()
            if keyword and keyword != table[part]:
                raise FamilyRegistrationError(
                    f"family {self.name!r}: {part.value} is given both as a keyword {list(keyword)} and in "
                    f"parts= {list(table[part])}; give it once")
        for name in _KEYWORD_PARTS:
            if getattr(self, name):
                table[Part(name)] = getattr(self, name)
        object.__setattr__(self, "parts", tuple((p.value, table[p]) for p in SELECTABLE_PARTS if table[p]))
        self._prefixes.update(table)

    def prefixes(self, part: Part) -> tuple[str, ...]:
        """The module prefixes of ``part`` (``()``: the family does not have it)."""
        return self.other if part is Part.OTHER else self._prefixes.get(part, ())

    def part_names(self) -> tuple[Part, ...]:
        """The parts this family has (a prefix each at least), in vocabulary order."""
        return tuple(p for p in SELECTABLE_PARTS if self._prefixes.get(p))

    def has_part(self, part: Part) -> bool:
        return bool(self._prefixes.get(part))

    def describe_parts(self) -> str:
        """``"language model, vision encoder, vision projection"``: the family's parts as a sentence names them."""
        return ", ".join(label(p) for p in self.part_names())

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
            "parts": [part.value for part in self.part_names()],
            **{part.value: list(self.prefixes(part)) for part in (*SELECTABLE_PARTS, Part.OTHER)},
            "description": self.description,
            "hf_model_types": list(self.hf_model_types),
            "recompute_note": self.recompute_note,
            "no_full_recompute": list(self.no_full_recompute),
            "full_recompute_affects": list(self.full_recompute_affects),
            "source": self.source,
            **({"layouts": {layout.provider: {part.value: list(variant.prefixes(part)) for part in variant.part_names()}
                            for layout, variant in zip(self.layouts, self._variants, strict=True)}}
               if self.layouts else {}),
        }
