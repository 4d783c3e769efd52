"""What the user asks for: one boolean per part (the vocabulary of :mod:`.parts`), and optional patterns.

The patterns (``train_patterns`` / ``freeze_patterns``: regular expressions over model-wide parameter or
module names) refine the flags; their syntax and rule are in :mod:`bridge_freeze_plugin.request._patterns`.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bridge_freeze_plugin.errors import FreezeFlagTypeError, InvalidPatternError
from bridge_freeze_plugin.request._parts import ALIASES, FLAG_PARTS, FLAGS, INFO, SELECTABLE_PARTS, Part

if TYPE_CHECKING:
    from bridge_freeze_plugin.request._patterns import PatternSet


#: The parts a flag can freeze, their flags and Bridge's aliases come from the vocabulary (:mod:`.parts`).
__all__ = ["ALIASES", "FLAGS", "FLAG_PARTS", "INFO", "PATTERN_KEYS", "SELECTABLE_PARTS", "FreezeSelection", "Part",
           "asked_text", "pattern_tuple", "type_name"]

#: The two pattern lists: provider attributes, config keys and :class:`FreezeSelection` fields alike.
PATTERN_KEYS: tuple[str, ...] = ("train_patterns", "freeze_patterns")

#: Every registered family, for :meth:`FreezeSelection.untrained_parts` without a family's prefixes. The request
#: knows no family: the families package hands in its ``list_families`` when it is imported (importing the plugin
#: imports it first), so that this folder imports nothing from ``families``.
_FAMILY_SOURCE: list[Callable[[], Iterable[Any]]] = []


def use_family_source(list_families: Callable[[], Iterable[Any]]) -> None:
    """Where :meth:`FreezeSelection.untrained_parts` finds every registered family (set by ``families``)."""
    _FAMILY_SOURCE[:] = [list_families]


def _registered_families() -> list[Any]:
    if not _FAMILY_SOURCE:  # importing bridge_freeze_plugin imports the families package, which sets it
        raise RuntimeError("bridge_freeze_plugin.families is not imported: import bridge_freeze_plugin first")
    return list(_FAMILY_SOURCE[0]())


def type_name(value: Any) -> str:
    """``bool``, ``str``... for built-ins; ``numpy.bool`` rather than a bare ``bool`` for anything else."""
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _hint(value: Any) -> str:
    return " (convert it with bool(...))" if hasattr(value, "__bool__") and type(value).__module__ != "builtins" else ""


def pattern_tuple(value: Any, key: str) -> tuple[str, ...]:
    """A pattern list as a tuple: ``None`` is none, one string is one pattern, else any list of strings."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, bytes | bytearray | memoryview | Mapping) or not hasattr(value, "__iter__"):
        raise InvalidPatternError(
            f"{key} must be a list of regular expressions (or one string), got {value!r} of type {type_name(value)}"
        )
    return tuple(value)


def _with_flag_fields(cls: type) -> type:
    """One ``bool`` field per flag of the vocabulary (default ``False``), before the class's own fields."""
    cls.__annotations__ = {**dict.fromkeys(FLAGS, "bool"), **inspect.get_annotations(cls)}
    for flag in FLAGS:
        setattr(cls, flag, False)
    return cls


def _assumed(frozen: Iterable[Part]) -> tuple[Part, ...]:
    """The parts a model is taken to have when its family is unknown: the vocabulary's assumed parts, and any part
    whose flag is set."""
    frozen = set(frozen)
    return tuple(p for p in SELECTABLE_PARTS if INFO[p].assumed or p in frozen)


@dataclass(frozen=True)
@_with_flag_fields
class FreezeSelection:
    """Which parts to freeze: one ``freeze_<part>`` field per part of the vocabulary (:mod:`.parts`), all ``False``
    by default (train the whole model).

    ``train_patterns`` / ``freeze_patterns`` refine the flags per parameter (compiled here: an invalid one
    raises :class:`InvalidPatternError`); see :mod:`bridge_freeze_plugin.request._patterns` for the rule.

    Methods that speak of "every part" take ``parts``: the parts the model has (its family's
    ``part_names()``); without it, the parts a vision-language model is assumed to have, plus any flagged part.
    """

    train_patterns: tuple[str, ...] = ()
    freeze_patterns: tuple[str, ...] = ()
    #: The compiled patterns (falsy when there are none).
    patterns: PatternSet = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in FLAGS:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise FreezeFlagTypeError(
                    f"{name} must be a bool (true/false), got {value!r} of type {type_name(value)}; "
                    f"set it to True or False{_hint(value)}"
                )
        from bridge_freeze_plugin.request._patterns import PatternSet

        for key in PATTERN_KEYS:
            object.__setattr__(self, key, pattern_tuple(getattr(self, key), key))
        object.__setattr__(self, "patterns", PatternSet.of(self.train_patterns, self.freeze_patterns))

    def parts_of(self, parts: Iterable[Part] | None = None) -> tuple[Part, ...]:
        """``parts`` in vocabulary order; ``None``: the assumed parts and every flagged part."""
        return _assumed(self.frozen_parts()) if parts is None else tuple(p for p in SELECTABLE_PARTS if p in set(parts))

    @property
    def any_set(self) -> bool:
        """A flag is set, or a pattern given: the selection asks for something beyond "train everything"."""
        return any(self.as_dict().values()) or bool(self.train_patterns or self.freeze_patterns)

    @property
    def all_set(self) -> bool:
        """Every part frozen (the assumed parts and any flagged one; :meth:`freezes_all` for a known family)."""
        return self.freezes_all()

    def freezes_all(self, parts: Iterable[Part] | None = None) -> bool:
        """Every one of ``parts`` (see :meth:`parts_of`) is frozen by its flag."""
        return set(self.parts_of(parts)) <= self.frozen_parts()

    def as_dict(self) -> dict[str, bool]:
        """Every flag (see :meth:`patterns_dict` and :meth:`provider_attributes` for the rest)."""
        return {name: getattr(self, name) for name in FLAGS}

    def patterns_dict(self) -> dict[str, list[str]]:
        """``{"train_patterns": [...], "freeze_patterns": [...]}``."""
        return {key: list(getattr(self, key)) for key in PATTERN_KEYS}

    def provider_attributes(self) -> dict[str, Any]:
        """Everything a provider holds of the selection: every flag and the two pattern lists."""
        return {**self.as_dict(), **self.patterns_dict()}

    def frozen_parts(self) -> frozenset[Part]:
        return frozenset(part for name, part in FLAG_PARTS.items() if getattr(self, name))

    def trained_parts(self, parts: Iterable[Part] | None = None) -> frozenset[Part]:
        """The parts (of ``parts``, see :meth:`parts_of`) whose flag lets them train (a train pattern may train
        parts of the others: see :meth:`untrained_parts`)."""
        return frozenset(self.parts_of(parts)) - self.frozen_parts()

    def untrained_parts(self, prefixes: Mapping[Part, Iterable[str]] | None = None) -> frozenset[Part]:
        """The parts none of whose parameters will train at full rank: frozen by their flag, and no train pattern
        can match a name under them (a train pattern wins over the flag).

        ``prefixes``: each part's module prefixes (its family's); ``None`` (family unknown, e.g. a config read
        alone): those of every registered family. A pattern that could match under one of them counts, so this
        errs towards "may train"; what a built model trains is exact (``requires_grad``).
        """
        frozen = self.frozen_parts()
        if not frozen or not self.patterns.train:
            return frozen
        if prefixes is None:
            families = _registered_families()
            prefixes = {part: [p for family in families for p in family.prefixes(part)] for part in frozen}
        return frozenset(
            part for part in frozen
            if not any(pattern.may_match_under(prefix)
                       for pattern in self.patterns.train for prefix in prefixes.get(part, ()))
        )

    def set_flags(self) -> tuple[str, ...]:
        return tuple(name for name in FLAGS if getattr(self, name))

    def describe(self, parts: Iterable[Part] | None = None) -> str:
        """``"train vision_projection"``: what trains at full rank, of ``parts`` (see :meth:`parts_of`)."""
        trained = [p.value for p in self.parts_of(parts) if p in self.trained_parts(parts)]
        text = "train " + (" + ".join(trained) if trained else "nothing (every part frozen)")
        if not self.patterns:
            return text
        return f"{text}; patterns: " + ", ".join(str(p) for p in self.patterns.all)

    @classmethod
    def from_object(cls, obj: Any) -> FreezeSelection:
        """Read the flags and patterns off a provider (or any object); a missing attribute means ``False`` / none.

        A Bridge field that means one of the flags (an alias, e.g. ``freeze_sound_encoder``) set ``True`` freezes
        that part too; like the flags, it must be a real ``bool`` (``1`` or ``"yes"`` is refused: Bridge's own
        freeze would read it as true, so ignoring it would train what Bridge alone freezes).
        """
        values = {name: getattr(obj, name, False) for name in FLAGS}
        for alias, flag in ALIASES.items():
            value = getattr(obj, alias, False)
            if not isinstance(value, bool):
                raise FreezeFlagTypeError(
                    f"{type(obj).__name__}: {alias} (Bridge's name of {flag}) must be a bool (true/false), got "
                    f"{value!r} of type {type_name(value)}; set it to True or False{_hint(value)}"
                )
            if value and values[flag] is False:
                values[flag] = True
        values.update({key: getattr(obj, key, None) for key in PATTERN_KEYS})
        try:
            return cls(**values)
        except (FreezeFlagTypeError, InvalidPatternError) as exc:
            raise type(exc)(f"{type(obj).__name__}: {exc}") from None

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> FreezeSelection:
        """Read the flags and patterns from a mapping (e.g. a ``megatron_config`` section); unknown keys ignored."""
        return cls(**{name: mapping[name] for name in (*FLAGS, *PATTERN_KEYS) if name in mapping})

    @classmethod
    def all_selections(cls, parts: Iterable[Part] | None = None) -> Iterator[FreezeSelection]:
        """Every selection of ``parts`` (default: the assumed parts, 8 selections), from "train everything" to
        "freeze everything"."""
        flags = [INFO[p].flag for p in (_assumed(()) if parts is None else cls().parts_of(parts))]
        for values in itertools.product((False, True), repeat=len(flags)):
            yield cls(**dict(zip(flags, values, strict=True)))


def asked_text(selection: FreezeSelection, key: Callable[[str], str] | None = None, true: str = "True") -> str:
    """What was asked, the one way every message says it: the flags set and the patterns given, as written
    (``key``: a flag or pattern name -> where it was written, e.g. ``model.freeze_vision_model``; ``true``: how that
    source spells true). ``""`` when nothing is asked."""
    where = key or (lambda name: name)
    asked = [f"{where(flag)}={true}" for flag in selection.set_flags()]
    for name, values in selection.patterns_dict().items():
        if values:
            asked.append(f"{where(name)}=[{', '.join(repr(v) for v in values)}]")
    return ", ".join(asked)
