"""What the user asks for: three booleans, one per part of a vision-language model, and optional patterns.

The patterns (``train_patterns`` / ``freeze_patterns``: regular expressions over model-wide parameter or
module names) refine the flags; their syntax and rule are in :mod:`bridge_freeze_plugin.patterns`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from bridge_freeze_plugin.errors import FreezeFlagTypeError, InvalidPatternError

if TYPE_CHECKING:
    from bridge_freeze_plugin.patterns import PatternSet


class Part(StrEnum):
    """The parts a VLM's parameters are divided into."""

    LANGUAGE_MODEL = "language_model"
    VISION_MODEL = "vision_model"
    VISION_PROJECTION = "vision_projection"
    #: Known modules outside the three parts (e.g. an audio tower): no flag touches them.
    OTHER = "other"


#: The three selectable parts, in the order flags and reports list them.
SELECTABLE_PARTS: tuple[Part, ...] = (Part.LANGUAGE_MODEL, Part.VISION_MODEL, Part.VISION_PROJECTION)

#: Flag name -> the part it freezes.
FLAG_PARTS: dict[str, Part] = {
    "freeze_language_model": Part.LANGUAGE_MODEL,
    "freeze_vision_model": Part.VISION_MODEL,
    "freeze_vision_projection": Part.VISION_PROJECTION,
}
FLAGS: tuple[str, ...] = tuple(FLAG_PARTS)

#: The two pattern lists: provider attributes, config keys and :class:`FreezeSelection` fields alike.
PATTERN_KEYS: tuple[str, ...] = ("train_patterns", "freeze_patterns")


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


@dataclass(frozen=True)
class FreezeSelection:
    """Which parts to freeze. All ``False`` (the default) trains the whole model.

    ``train_patterns`` / ``freeze_patterns`` refine the flags per parameter (compiled here: an invalid one
    raises :class:`InvalidPatternError`); see :mod:`bridge_freeze_plugin.patterns` for the rule.
    """

    freeze_language_model: bool = False
    freeze_vision_model: bool = False
    freeze_vision_projection: bool = False
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
        from bridge_freeze_plugin.patterns import PatternSet

        for key in PATTERN_KEYS:
            object.__setattr__(self, key, pattern_tuple(getattr(self, key), key))
        object.__setattr__(self, "patterns", PatternSet.of(self.train_patterns, self.freeze_patterns))

    @property
    def any_set(self) -> bool:
        """A flag is set, or a pattern given: the selection asks for something beyond "train everything"."""
        return any(self.as_dict().values()) or bool(self.train_patterns or self.freeze_patterns)

    @property
    def all_set(self) -> bool:
        return all(self.as_dict().values())

    def as_dict(self) -> dict[str, bool]:
        """The three flags (see :meth:`patterns_dict` and :meth:`provider_attributes` for the rest)."""
        return {name: getattr(self, name) for name in FLAGS}

    def patterns_dict(self) -> dict[str, list[str]]:
        """``{"train_patterns": [...], "freeze_patterns": [...]}``."""
        return {key: list(getattr(self, key)) for key in PATTERN_KEYS}

    def provider_attributes(self) -> dict[str, Any]:
        """Everything a provider holds of the selection: the three flags and the two pattern lists."""
        return {**self.as_dict(), **self.patterns_dict()}

    def frozen_parts(self) -> frozenset[Part]:
        return frozenset(part for name, part in FLAG_PARTS.items() if getattr(self, name))

    def trained_parts(self) -> frozenset[Part]:
        """The parts whose flag lets them train (a train pattern may train parts of the others: see
        :meth:`untrained_parts`)."""
        return frozenset(SELECTABLE_PARTS) - self.frozen_parts()

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
            from bridge_freeze_plugin.registry import list_families

            families = list_families()
            prefixes = {part: [p for family in families for p in family.prefixes(part)] for part in frozen}
        return frozenset(
            part for part in frozen
            if not any(pattern.may_match_under(prefix)
                       for pattern in self.patterns.train for prefix in prefixes.get(part, ()))
        )

    def set_flags(self) -> tuple[str, ...]:
        return tuple(name for name in FLAGS if getattr(self, name))

    def describe(self) -> str:
        trained = [p.value for p in SELECTABLE_PARTS if p in self.trained_parts()]
        text = "train " + (" + ".join(trained) if trained else "nothing (all three parts frozen)")
        if not self.patterns:
            return text
        return f"{text}; patterns: " + ", ".join(str(p) for p in self.patterns.all)

    @classmethod
    def from_object(cls, obj: Any) -> FreezeSelection:
        """Read the flags and patterns off a provider (or any object); a missing attribute means ``False`` / none."""
        values = {name: getattr(obj, name, False) for name in FLAGS}
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
    def all_selections(cls) -> Iterator[FreezeSelection]:
        """The 8 selections, from "train everything" to "freeze everything"."""
        for values in itertools.product((False, True), repeat=len(FLAGS)):
            yield cls(**dict(zip(FLAGS, values, strict=True)))
