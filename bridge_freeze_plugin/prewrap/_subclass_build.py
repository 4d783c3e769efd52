"""A subclass of a family's provider whose ``provide()`` changes the model its base built.

Bridge 0.7.0's ``Qwen35TokenClassificationModelProvider`` calls the Qwen3.5-VL provider's ``provide()`` and then
replaces ``language_model.output_layer`` with a fresh classifier head. Activation wraps such a subclass's own
``provide()`` (:mod:`bridge_freeze_plugin.activation`), so the selection applies once, to the model the
OUTERMOST ``provide()`` returns, on every build path (``provide``, ``provide_distributed_model``, ``get_model``,
Bridge's setup), and the report counts what trains.

What the subclass added (parameters none of its base's builds returned) is the subclass's, not the family's: the
family's table describes the family's model, not a head or a fixed table a subclass puts in it. So:

- each addition keeps the ``requires_grad`` the subclass gave it (remembered on the parameter, :data:`ADDED_ATTR`),
  unless a train or freeze pattern names it: installing the plugin changes nothing a subclass decided, in either
  direction, and the report says which additions a flag would have decided otherwise;
- a trainable addition that a flag would freeze with the part whose prefix it sits under is refused by name (a
  fresh head frozen with a frozen backbone would never train), unless a pattern matches THAT parameter: a train
  pattern keeps it training (``train_patterns=["language_model.output_layer"]``), a freeze pattern freezes it on
  purpose. A pattern that matches other parameters exempts nothing.
"""

from __future__ import annotations

from typing import Any

from bridge_freeze_plugin.errors import UnsupportedFreezeFlagError

__all__ = ["ADDED_ATTR", "added_after_base", "addition_notes", "mark_additions", "parameter_ids"]

_SHOWN = 5

#: Set on each parameter a subclass's ``provide()`` added after its base's build: the ``requires_grad`` the
#: subclass gave it. What the selection's flags would say is replaced by it (patterns still decide).
ADDED_ATTR = "bridge_freeze_subclass_requires_grad"


def parameter_ids(model: Any) -> dict[int, Any]:
    """The parameters a build returned, by id, as they were when it returned (a subclass may replace some after).

    The parameters themselves are held, not only their ids: one the subclass drops (the output layer it
    replaces) is freed otherwise, and the new head's parameter may get its id."""
    return {id(p): p for p in model.parameters()} if hasattr(model, "parameters") else {}


def added_after_base(model: Any, base_built: list[dict[int, Any]]) -> set[str]:
    """Names of ``model``'s parameters that none of the base builds returned (empty: no base build inside)."""
    if not base_built:
        return set()
    base = {key for built in base_built for key in built}
    return {name for name, param in model.named_parameters() if id(param) not in base}


def _shown(names: list[str]) -> str:
    return ", ".join(names[:_SHOWN]) + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def mark_additions(provider: Any, model: Any, added: set[str], context: Any) -> None:
    """Remember the subclass's ``requires_grad`` on each addition; raise for a trainable one a flag would freeze
    that no pattern names. Call BEFORE the freeze (which then keeps what is remembered)."""
    if not added:
        return
    from bridge_freeze_plugin.prewrap._classify import as_chunks
    from bridge_freeze_plugin.prewrap._model_names import model_wide_names

    family, selection = context.family, context.selection
    patterns = selection.patterns
    wide = model_wide_names(as_chunks(model)) if patterns else {}
    frozen_parts = selection.frozen_parts()
    refused: list[tuple[str, str]] = []
    for name, param in model.named_parameters():
        if name not in added:
            continue
        setattr(param, ADDED_ATTR, bool(param.requires_grad))
        part = family.classify(name)
        named = bool(patterns) and bool(patterns.hits(wide.get(id(param), name)))
        if param.requires_grad and part is not None and part in frozen_parts and not named:
            refused.append((name, part.value))
    if refused:
        raise _refusal(provider, context, sorted(refused))


def _refusal(provider: Any, context: Any, refused: list[tuple[str, str]]) -> UnsupportedFreezeFlagError:
    names = [name for name, _ in refused]
    parts = sorted({part for _, part in refused})
    modules = sorted({name.rsplit(".", 1)[0] for name in names})
    return UnsupportedFreezeFlagError(
        f"{context.asked}: {type(provider).__name__}.provide() adds or replaces parameters after the "
        f"{context.family.name} family's own build ({_shown(names)}), and the selection would freeze them with the "
        f"{', '.join(parts)} part although that family's table does not describe them (a head this "
        f"subclass makes would never train), and no train or freeze pattern names them. Say what they do by name: "
        f"train them with train_patterns=[{', '.join(repr(m) for m in modules)}], or freeze them on purpose with "
        f"freeze_patterns=[...] matching them"
    )


def addition_notes(model: Any, context: Any) -> tuple[str, ...]:
    """The report's note on additions that keep the subclass's ``requires_grad`` where a flag would say otherwise."""
    from bridge_freeze_plugin.prewrap._classify import as_chunks, named_parameters
    from bridge_freeze_plugin.prewrap._model_names import model_wide_names

    if context.family is None:
        return ()
    patterns = context.selection.patterns
    wide = model_wide_names(as_chunks(model)) if patterns else {}
    frozen_parts = context.selection.frozen_parts()
    kept: dict[tuple[str, bool], list[str]] = {}
    for _, name, param in named_parameters(model):
        given = getattr(param, ADDED_ATTR, None)
        part = context.family.classify(name)
        if given is None or part is None or (patterns and patterns.hits(wide.get(id(param), name))):
            continue  # not an addition, or a pattern decides it
        if given != (part not in frozen_parts):
            kept.setdefault((part.value, given), []).append(name)
    return tuple(
        f"{part}: {len(names)} tensor(s) the provider's provide() added after the family's build "
        f"{'train' if trains else 'stay frozen'} as it set them ({_shown(sorted(names))}); a train or freeze "
        f"pattern naming them decides otherwise"
        for (part, trains), names in sorted(kept.items())
    )
