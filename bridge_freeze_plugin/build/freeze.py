"""The pre-wrap freeze: classify every parameter by the family's prefixes and set ``requires_grad``.

Runs on bare model chunks (a list for virtual pipeline, or one module) before Float16Module and the
DDP wrap, so DDP allocates no gradient buffer and the optimizer keeps no state for frozen weights.
Generic: everything family-specific comes from the :class:`~bridge_freeze_plugin.registry.FamilySpec`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from bridge_freeze_plugin.errors import UnclassifiedParameterError
from bridge_freeze_plugin.registry import FamilySpec, canonical_name
from bridge_freeze_plugin.report import DefaultOverride, FreezeReport, PartCount, ordered_parts
from bridge_freeze_plugin.selection import SELECTABLE_PARTS, FreezeSelection, Part

logger = logging.getLogger("bridge_freeze_plugin")

#: Attribute set on each chunk once a selection was applied (idempotence, log once).
STATE_ATTR = "_bridge_freeze_state"

_MAX_NAMES_IN_ERROR = 20


@dataclass
class ChunkState:
    selection: FreezeSelection
    family: str
    reported: bool = False


def as_chunks(model: Any) -> list[Any]:
    """A model given as one module, or a list of chunks (virtual pipeline), as a list."""
    if isinstance(model, (list, tuple)):
        return list(model)
    return [model]


def iter_named_parameters(chunks: Iterable[Any]) -> Iterator[tuple[int, str, Any]]:
    """(chunk index, canonical name, parameter) for every parameter of every chunk."""
    for index, chunk in enumerate(chunks):
        for name, param in chunk.named_parameters():
            yield index, canonical_name(name), param


def _describe(chunk_index: int, name: str, n_chunks: int) -> str:
    return f"chunk {chunk_index}: {name}" if n_chunks > 1 else name


def apply_selection(
    model: Any,
    family: FamilySpec,
    selection: FreezeSelection,
    *,
    provider_name: str = "",
    model_name: str | None = None,
    overridden_defaults: tuple[DefaultOverride, ...] = (),
) -> FreezeReport:
    """Freeze the parts ``selection`` asks for and make the others trainable; return the report.

    Every parameter of a frozen part gets ``requires_grad=False``; every parameter of a trained part
    gets ``requires_grad=True`` (so whatever ran before, what trains is exactly what was asked).
    Parameters under ``other`` prefixes are left as they are. While any flag is set, a parameter under
    no prefix of the family raises :class:`UnclassifiedParameterError` listing the names.
    Applying the same selection twice changes nothing.
    """
    chunks = as_chunks(model)
    frozen = selection.frozen_parts()
    classify = family.classify  # canonicalises the name itself
    classified: list[tuple[Part | None, Any]] = []
    unclassified: list[str] = []
    # One traversal and one classification per parameter: the report below reuses them.
    for index, chunk in enumerate(chunks):
        for name, param in chunk.named_parameters():
            part = classify(name)
            if part is None:
                unclassified.append(_describe(index, canonical_name(name), len(chunks)))
            classified.append((part, param))

    if unclassified and selection.any_set:
        shown = ", ".join(unclassified[:_MAX_NAMES_IN_ERROR])
        more = f" (and {len(unclassified) - _MAX_NAMES_IN_ERROR} more)" if len(unclassified) > 20 else ""
        raise UnclassifiedParameterError(
            f"{', '.join(f'{f}=True' for f in selection.set_flags())} was asked of "
            f"{provider_name or 'the model'}{f' ({model_name})' if model_name else ''}, but "
            f"{len(unclassified)} parameter(s) fall under no prefix of family {family.name!r}, so the "
            f"plugin cannot tell which part they belong to: {shown}{more}. Add their module to the "
            f"family's table (language_model / vision_model / vision_projection / other), or unset "
            f"the freeze flags."
        )

    for part, param in classified:
        if part in frozen:
            param.requires_grad_(False)
        elif part in SELECTABLE_PARTS:
            param.requires_grad_(True)

    for chunk in chunks:
        state = getattr(chunk, STATE_ATTR, None)
        if state is None or state.selection != selection or state.family != family.name:
            object.__setattr__(chunk, STATE_ATTR, ChunkState(selection, family.name))

    report = _report(
        classified,
        family,
        selection,
        provider_name=provider_name,
        model_name=model_name,
        overridden_defaults=overridden_defaults,
    )
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("bridge-freeze applied to %d chunk(s):\n%s", len(chunks), report.format())
    return report


def count_parts(
    model: Any,
    family: FamilySpec,
    selection: FreezeSelection,
    *,
    provider_name: str = "",
    model_name: str | None = None,
    overridden_defaults: tuple[DefaultOverride, ...] = (),
) -> FreezeReport:
    """The per-part report of ``model`` as it is now (changes nothing)."""
    classified = [(family.classify(name), param) for _, name, param in iter_named_parameters(as_chunks(model))]
    return _report(
        classified,
        family,
        selection,
        provider_name=provider_name,
        model_name=model_name,
        overridden_defaults=overridden_defaults,
    )


def _report(
    classified: list[tuple[Part | None, Any]],
    family: FamilySpec,
    selection: FreezeSelection,
    *,
    provider_name: str,
    model_name: str | None,
    overridden_defaults: tuple[DefaultOverride, ...],
) -> FreezeReport:
    """Tally (part, parameter) pairs, in traversal order, as they are now."""
    seen: set[int] = set()
    counts: dict[Part, list[int]] = {}
    for part, param in classified:
        if id(param) in seen:  # a tensor shared between modules counts once
            continue
        seen.add(id(param))
        row = counts.setdefault(Part.OTHER if part is None else part, [0, 0, 0, 0])
        n = param.numel()
        row[1] += n
        row[3] += 1
        if param.requires_grad:
            row[0] += n
            row[2] += 1
    return FreezeReport(
        family=family.name,
        provider=provider_name,
        model_name=model_name,
        selection=selection,
        parts=ordered_parts({p: PartCount(p, *row) for p, row in counts.items()}),
        overridden_defaults=overridden_defaults,
    )


def claim_report(model: Any) -> bool:
    """True the first time it is asked for these chunks: the caller then logs the report."""
    chunks = as_chunks(model)
    states = [getattr(c, STATE_ATTR, None) for c in chunks]
    if any(s is None for s in states) or all(s.reported for s in states):
        return False
    for state in states:
        state.reported = True
    return True
