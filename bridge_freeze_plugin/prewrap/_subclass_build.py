"""A subclass of a family's provider whose ``provide()`` changes the model its base built.

Bridge 0.7.0's ``Qwen35TokenClassificationModelProvider`` calls the Qwen3.5-VL provider's ``provide()`` and then
replaces ``language_model.output_layer`` with a fresh classifier head. Activation wraps such a subclass's own
``provide()`` (:mod:`bridge_freeze_plugin.activation`), so the selection applies once, to the model the
OUTERMOST ``provide()`` returns, on every build path (``provide``, ``provide_distributed_model``, ``get_model``,
Bridge's setup), and the report counts what trains.

The decision for what the subclass added: it is refused by name when a flag would freeze it. The family's
table describes the family's model, not a head a subclass puts in it: a fresh head frozen with the part whose
prefix it happens to sit under would never train (a frozen-backbone classifier with a frozen, random classifier),
and counting it as that part would misreport it. The user decides, by name: a train pattern keeps it training
(``train_patterns=["language_model.output_layer"]``), a freeze pattern freezes it on purpose.
"""

from __future__ import annotations

from typing import Any

from bridge_freeze_plugin.errors import UnsupportedFreezeFlagError

__all__ = ["added_after_base", "parameter_ids", "refuse_frozen_additions"]

_SHOWN = 5


def parameter_ids(model: Any) -> frozenset[int]:
    """The parameters a build returned, as they were when it returned (a subclass may replace some after)."""
    return frozenset(id(p) for p in model.parameters()) if hasattr(model, "parameters") else frozenset()


def added_after_base(model: Any, base_built: list[frozenset[int]]) -> set[str]:
    """Names of ``model``'s parameters that none of the base builds returned (empty: no base build inside)."""
    if not base_built:
        return set()
    base = frozenset().union(*base_built)
    return {name for name, param in model.named_parameters() if id(param) not in base}


def refuse_frozen_additions(provider: Any, model: Any, added: set[str], context: Any) -> None:
    """Raise when the flags froze a parameter the subclass's ``provide()`` added after its base's build."""
    if not added or context.selection.freeze_patterns:
        return
    frozen = sorted(name for name, param in model.named_parameters() if name in added and not param.requires_grad)
    if not frozen:
        return
    family = context.family
    parts = sorted({family.classify(name).value for name in frozen if family.classify(name) is not None})
    shown = ", ".join(frozen[:_SHOWN]) + (f" and {len(frozen) - _SHOWN} more" if len(frozen) > _SHOWN else "")
    modules = sorted({name.rsplit(".", 1)[0] for name in frozen})
    raise UnsupportedFreezeFlagError(
        f"{context.asked}: {type(provider).__name__}.provide() adds or replaces parameters after the "
        f"{family.name} family's own build ({shown}), and the selection would freeze them with the "
        f"{', '.join(parts) or 'family'} part although that family's table does not describe them (a head this "
        f"subclass makes would never train). Say what they do by name: train them with "
        f"train_patterns=[{', '.join(repr(m) for m in modules)}], or freeze them on purpose with "
        f"freeze_patterns=[...]"
    )
