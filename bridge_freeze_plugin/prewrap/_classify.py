"""Which part each parameter belongs to, by identity first, by name second.

At the plugin's freeze the chunks are bare: every parameter is classified by the family's prefixes and
remembered by identity. After that, hooks may wrap the chunks (``torch.compile``'s ``_orig_mod.``, any
module that renames) or wrap single layers (LoRA's ``to_wrap``): an original parameter keeps its part
whatever its name becomes. A parameter the plugin never saw (added by a hook) is classified by its name,
with the segments wrappers insert removed; ``None`` when no prefix of the family covers it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from bridge_freeze_plugin.families import FamilySpec, canonical_name
from bridge_freeze_plugin.prewrap._adapters import base_name
from bridge_freeze_plugin.request import Part


def as_chunks(model: Any) -> list[Any]:
    """A model given as one module, or a list of chunks (virtual pipeline), as a list."""
    if isinstance(model, (list, tuple)):
        return list(model)
    return [model]


def named_parameters(model: Any) -> Iterator[tuple[int, str, Any]]:
    """(chunk index, canonical name, parameter) for every parameter of every chunk, shared ones once."""
    seen: set[int] = set()
    for index, chunk in enumerate(as_chunks(model)):
        for name, param in chunk.named_parameters():
            if id(param) in seen:
                continue
            seen.add(id(param))
            yield index, canonical_name(name), param


class Classifier:
    """Parts of a model's parameters: remembered by identity at the freeze, by name for newcomers."""

    def __init__(self, family: FamilySpec) -> None:
        self.family = family
        self._parts: dict[int, Part | None] = {}
        self._bare: dict[int, str] = {}
        self._params: dict[int, Any] = {}
        self._names: set[str] = set()

    def remember(self, params: Iterable[tuple[str, Any]]) -> list[tuple[str, Part | None, Any]]:
        """Classify bare-chunk parameters by name and remember them; returns (name, part, param)."""
        out = []
        for name, param in params:
            part = self.family.classify(name)
            self._parts[id(param)] = part
            self._bare[id(param)] = name
            self._params[id(param)] = param
            self._names.add(base_name(name))
            out.append((name, part, param))
        return out

    def remembered(self) -> Iterator[tuple[str, Part | None, Any]]:
        """(bare name, part, parameter) of every parameter the freeze saw."""
        for key, param in self._params.items():
            yield self._bare[key], self._parts[key], param

    def known(self, param: Any) -> bool:
        return id(param) in self._parts

    def names_a_known_parameter(self, name: str) -> bool:
        """A newcomer under the (base) name of a parameter the freeze saw: a hook REPLACED that weight."""
        return any(candidate in self._names for candidate in self._name_candidates(name))

    def bare_name(self, name: str, param: Any) -> str:
        """The name the parameter had on the bare chunk at the freeze (newcomers: without wrapper segments)."""
        if id(param) in self._bare:
            return self._bare[id(param)]
        return next((c for c in self._name_candidates(name) if self.family.classify(c) is not None),
                    base_name(canonical_name(name)))

    def part(self, name: str, param: Any) -> Part | None:
        if id(param) in self._parts:
            return self._parts[id(param)]
        return self.part_by_name(name)

    def part_by_name(self, name: str) -> Part | None:
        for candidate in self._name_candidates(name):
            part = self.family.classify(candidate)
            if part is not None:
                return part
        return None

    @staticmethod
    def _name_candidates(name: str) -> Iterator[str]:
        """The name without PEFT segments, then without each leading segment in turn (a wrapper's prefix)."""
        segments = base_name(canonical_name(name)).split(".")
        for start in range(len(segments)):
            yield ".".join(segments[start:])
