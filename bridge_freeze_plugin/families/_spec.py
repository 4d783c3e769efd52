"""One VLM family as data: :class:`FamilySpec`, the module prefixes of each part, checked when it is made.

A prefix names a module as a bare model chunk's ``named_parameters()`` spells it; a parameter belongs to the
part with the longest matching prefix. :mod:`bridge_freeze_plugin.families._registry` holds the registered specs.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from bridge_freeze_plugin.errors import FamilyRegistrationError
from bridge_freeze_plugin.families._spec_checks import (
    _FAMILY_NAME,
    _KEYWORD_PARTS,
    SEQUENCE_FIELDS,
    WRAPPER_PREFIX,
    _check_flag_defaults,
    _check_offline_configs,
    _check_prefix,
    _check_providers,
    _check_scalars,
    _string_tuple,
    class_path,
    linear_leaf_table,
)
from bridge_freeze_plugin.request import REQUIRED_PARTS, SELECTABLE_PARTS, Part, label

#: Up to this many prefixes, :meth:`FamilySpec.classify` tests them in turn (faster than walking
#: the name up through a dict, one ``rfind`` + slice per module level); above it, it walks.
_MAX_LINEAR_PREFIXES = 16


def canonical_name(name: str) -> str:
    """A parameter name as a pre-wrap hook sees it: strips the ``module.`` added by wrappers."""
    while name.startswith(WRAPPER_PREFIX):
        name = name[len(WRAPPER_PREFIX) :]
    return name


@dataclass(frozen=True)
class ProviderLayout:
    """Another layout of a family's parts, for one provider class and its subclasses.

    A family whose provider classes build different module trees (Nemotron Omni on Bridge 0.7.0: top-level
    parts on ``NemotronOmniModelProvider``, ``llava_model.*`` on the legacy ``NemotronOmniLlavaModelProvider``)
    gives each its table here; a provider of no listed class uses the family's own table. ``parts`` maps every
    part the layout has to its prefixes (the family's ``other`` is kept). ``when_field``: the layout applies
    only to a provider class that has this dataclass field (the Bridge version that builds that tree declares
    it, an older one with the same class name does not). ``plain_linear``: the family's ``plain_linear`` as this
    layout names those modules (a layout of its own tree does not inherit the family's module names).
    """

    provider: str
    parts: Any
    when_field: str = ""
    description: str = ""
    plain_linear: tuple[str, ...] = ()


@dataclass(frozen=True)
class OfflineConfig:
    """How ``plan`` reads, offline, a published ``config.json`` whose ``model_type`` is hub remote code.

    Either ``sub_configs``: the keys whose objects are types transformers has itself (read with its own classes;
    ``objects``: keys the maker's config class holds as config objects, read as plain ``PretrainedConfig``), or
    ``reader``: ``"package.module:function"`` called with the JSON object and the file's path.
    """

    model_type: str
    sub_configs: tuple[str, ...] = ()
    objects: tuple[str, ...] = ()
    reader: str = ""


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
    #: Modules (prefixes) whose linear layers are plain ``torch.nn.Linear`` (HF-implemented towers): LoRA there
    #: becomes a bare ``LinearAdapter`` on Bridge up to 0.6.2, whose training no Bridge export carries (config rules
    #: refuse such targets where the installed Bridge's LoRA does so; the build refuses bare adapters whatever the
    #: table says).
    plain_linear: tuple[str, ...] = ()
    #: Part name (or ``"other"``) -> the leaf names of its linear modules (the last segment of each module's
    #: name, what Bridge's LoRA matches a target without ``.`` or ``*`` against), read off the built model; the
    #: language model lists ``output_layer`` (absent where the embeddings are tied). Empty: not known (a leaf-name
    #: target is then left to the build). Stored as sorted ``(part, leaves)`` pairs; :meth:`linear_leaves_of`.
    linear_leaves: Any = ()
    #: Bridge's own names of a flag (``request.ALIASES``: ``freeze_sound_encoder``...) that this family's provider
    #: declares as fields; written for another family, a run drops them (or NeMo-RL refuses them).
    aliases: tuple[str, ...] = ()
    #: The freeze flags its Bridge provider (the first in ``providers``) defaults to true, read from its source: a
    #: trainer that passes only the flags a config writes (NeMo-RL) leaves these on.
    provider_flag_defaults: tuple[str, ...] = ()
    #: Remote-code ``model_type`` values (of ``hf_model_types``) that ``plan`` reads offline (:class:`OfflineConfig`).
    offline_configs: tuple[OfflineConfig, ...] = ()
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
        _check_flag_defaults(self)
        object.__setattr__(self, "offline_configs", _check_offline_configs(self, OfflineConfig))
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
        self._check_plain_linear()
        object.__setattr__(self, "linear_leaves", linear_leaf_table(self, self.linear_leaves))
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
                                    parts=layout.parts, layouts=(), description=described,
                                    plain_linear=tuple(layout.plain_linear)))
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

    def for_model(self, names: Iterable[str]) -> FamilySpec:
        """The table a built model with these parameter names was made by, for a model with no provider to ask
        (``apply_selection`` on a model built by hand): this family's own table when it covers every name, else the
        first layout's that does, else the one that leaves the fewest unclassified (its error names them)."""
        if not self.layouts:
            return self
        names = list(names)
        tables = [self, *self._variants]
        uncovered = [sum(1 for name in names if table.classify(name) is None) for table in tables]
        return tables[uncovered.index(min(uncovered))]

    def _check_plain_linear(self) -> None:
        for prefix in self.plain_linear:
            part = self.classify(f"{prefix}.weight")
            if part is None:
                raise FamilyRegistrationError(
                    f"family {self.name!r}: plain_linear prefix {prefix!r} lies under no prefix of any part; "
                    f"name a module of the family's parts")
            _check_prefix(self.name, part, prefix)

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

    def linear_leaves_of(self, part: Part) -> tuple[str, ...] | None:
        """The leaf names of ``part``'s linear modules (``Part.OTHER``: of the modules in no part); ``None``: the
        family's table does not say (no table at all)."""
        if not self.linear_leaves:
            return None
        return dict(self.linear_leaves).get(part.value, ())

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
        if name.startswith(WRAPPER_PREFIX):
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
            "plain_linear": list(self.plain_linear),
            "linear_leaves": {part: list(leaves) for part, leaves in self.linear_leaves},
            "source": self.source,
            "layouts": {layout.provider: {part.value: list(variant.prefixes(part)) for part in variant.part_names()}
                        for layout, variant in zip(self.layouts, self._variants, strict=True)},
        }
