"""What the user asks for: three booleans, one per part of a vision-language model."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

from bridge_freeze_plugin.errors import FreezeFlagTypeError


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


def type_name(value: Any) -> str:
    """``bool``, ``str``... for built-ins; ``numpy.bool`` rather than a bare ``bool`` for anything else."""
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _hint(value: Any) -> str:
    return " (convert it with bool(...))" if hasattr(value, "__bool__") and type(value).__module__ != "builtins" else ""


@dataclass(frozen=True)
class FreezeSelection:
    """Which parts to freeze. All ``False`` (the default) trains the whole model."""

    freeze_language_model: bool = False
    freeze_vision_model: bool = False
    freeze_vision_projection: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, bool):
                raise FreezeFlagTypeError(
                    f"{f.name} must be a bool (true/false), got {value!r} of type {type_name(value)}; "
                    f"set it to True or False{_hint(value)}"
                )

    @property
    def any_set(self) -> bool:
        return any(self.as_dict().values())

    @property
    def all_set(self) -> bool:
        return all(self.as_dict().values())

    def as_dict(self) -> dict[str, bool]:
        return {name: getattr(self, name) for name in FLAGS}

    def frozen_parts(self) -> frozenset[Part]:
        return frozenset(part for name, part in FLAG_PARTS.items() if getattr(self, name))

    def trained_parts(self) -> frozenset[Part]:
        return frozenset(SELECTABLE_PARTS) - self.frozen_parts()

    def set_flags(self) -> tuple[str, ...]:
        return tuple(name for name in FLAGS if getattr(self, name))

    def describe(self) -> str:
        trained = [p.value for p in SELECTABLE_PARTS if p in self.trained_parts()]
        return "train " + (" + ".join(trained) if trained else "nothing (all three parts frozen)")

    @classmethod
    def from_object(cls, obj: Any) -> FreezeSelection:
        """Read the three flags off a provider (or any object); a missing attribute means ``False``."""
        try:
            return cls(**{name: getattr(obj, name, False) for name in FLAGS})
        except FreezeFlagTypeError as exc:
            raise FreezeFlagTypeError(f"{type(obj).__name__}: {exc}") from None

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> FreezeSelection:
        """Read the three flags from a mapping (e.g. a ``megatron_config`` section); unknown keys ignored."""
        return cls(**{name: mapping[name] for name in FLAGS if name in mapping})

    @classmethod
    def all_selections(cls) -> Iterator[FreezeSelection]:
        """The 8 selections, from "train everything" to "freeze everything"."""
        for values in itertools.product((False, True), repeat=len(FLAGS)):
            yield cls(**dict(zip(FLAGS, values, strict=True)))
