"""The vocabulary of parts: every name the plugin derives from a part is derived here, from one table.

A part is a group of a model's modules that one flag freezes. Each entry of :data:`VOCABULARY` gives a part's
name; everything else follows from it: the flag (``freeze_<name>``), the learning-rate keys
(``lr_<name>`` / ``min_lr_<name>``), the command-line options (``--freeze-<name>``, ``--lr-<name>``), the report
row, the words messages use (``label``), and Bridge's own provider fields that mean the same flag (``aliases``).

Adding a part is one entry here plus the families that have it (their module prefixes, in ``families/``).
This module imports nothing from the package (a leaf): every other module may import it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class PartInfo:
    """One part of a multimodal model, and the names derived from it."""

    #: The part's name: a Python identifier, the key in family tables, reports and config keys.
    name: str
    #: How a sentence names it (``"vision encoder"``).
    label: str
    #: Bridge's own provider fields that freeze this same part under another name (read as this part's flag).
    aliases: tuple[str, ...] = ()
    #: ``False``: every family has it (the language model); ``True``: a family may lack it, and then a flag
    #: set for it is refused for that family, and its row is absent from the report.
    optional: bool = True
    #: Taken to be present when the model's family is unknown (a config read alone): the vision-language parts.
    assumed: bool = False
    #: Always holds linear layers (an encoder, a language model), so LoRA with no target list puts adapters there
    #: for certain; a projection may have none (Gemma 3's projector is a weight and a norm).
    linear: bool = False
    #: A projection into the language model (what a "projection only" run trains).
    projection: bool = False
    #: The input only this part reads (``"image"``, ``"audio"``; empty: every batch reaches it): a batch without
    #: it never runs the part, which is what the run-time audit says when the part got no gradient.
    media: str = ""

    @property
    def flag(self) -> str:
        return f"freeze_{self.name}"

    @property
    def lr_key(self) -> str:
        return f"lr_{self.name}"

    @property
    def min_lr_key(self) -> str:
        return f"min_lr_{self.name}"

    @property
    def option(self) -> str:
        """The command-line freeze option (``--freeze-vision-model``)."""
        return "--" + self.flag.replace("_", "-")

    @property
    def lr_option(self) -> str:
        return "--" + self.lr_key.replace("_", "-")


#: Every part a flag can freeze, in the order flags, options and report rows list them.
VOCABULARY: tuple[PartInfo, ...] = (
    PartInfo("language_model", "language model", optional=False, assumed=True, linear=True),
    PartInfo("vision_model", "vision encoder", assumed=True, linear=True, media="image"),
    PartInfo("vision_projection", "vision projection", assumed=True, projection=True, media="image"),
    PartInfo("audio_model", "audio encoder", aliases=("freeze_sound_encoder",), linear=True, media="audio"),
    PartInfo("audio_projection", "audio projection", ("freeze_sound_projection",), projection=True, media="audio"),
)

#: The name of the catch-all part: known modules outside every part (a talker, an MTP head): no flag touches them.
OTHER = "other"

#: The parts, as an enum (``Part.VISION_MODEL == "vision_model"``), generated from :data:`VOCABULARY`; ``OTHER``
#: last.
Part = StrEnum("Part", [(info.name.upper(), info.name) for info in VOCABULARY] + [(OTHER.upper(), OTHER)])
Part.__doc__ = "The parts a model's parameters are divided into (one per vocabulary entry, and ``other``)."
Part.__module__ = __name__

#: part -> its vocabulary entry.
INFO: dict[Part, PartInfo] = {Part(info.name): info for info in VOCABULARY}
#: part name -> part (a learning-rate key or a config names a part by name).
BY_NAME: dict[str, Part] = {part.value: part for part in INFO}
#: The parts a flag selects, in vocabulary order.
SELECTABLE_PARTS: tuple[Part, ...] = tuple(INFO)
#: Parts every family has.
REQUIRED_PARTS: tuple[Part, ...] = tuple(p for p, info in INFO.items() if not info.optional)
#: Flag name -> the part it freezes.
FLAG_PARTS: dict[str, Part] = {info.flag: part for part, info in INFO.items()}
#: The flags, in vocabulary order.
FLAGS: tuple[str, ...] = tuple(FLAG_PARTS)
#: Bridge's own field name -> the plugin's flag it means.
ALIASES: dict[str, str] = {alias: info.flag for info in VOCABULARY for alias in info.aliases}


def label(part: Part) -> str:
    """How a sentence names ``part`` (``"other modules"`` for ``other``)."""
    return INFO[part].label if part in INFO else "other modules"


def spoken(words: Iterable[str], last: str = "or") -> str:
    """``"a, b or c"``: a list as a sentence says it (messages that list parts build it from the parts)."""
    items = list(words)
    return f"{', '.join(items[:-1])} {last} {items[-1]}" if len(items) > 1 else "".join(items)


def in_order(parts: Iterable[str]) -> tuple[Part, ...]:
    """``parts`` (parts or part names) in vocabulary order, ``other`` last; unknown names dropped."""
    wanted = {str(p) for p in parts}
    return tuple(p for p in Part if p.value in wanted)
