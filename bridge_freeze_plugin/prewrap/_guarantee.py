"""The build-time guarantee: after every pre-wrap hook has run, what trains is what was asked.

Other pre-wrap hooks run after the plugin's freeze: HF weight loading, Bridge's PEFT hook (which
freezes the WHOLE base model before adding adapters), anything a user registered. Rules, while any flag
is set (with no flag set the plugin promises nothing beyond "nothing frozen by a provider default", and
other hooks such as plain LoRA decide):

- a parameter of a frozen part must be frozen; one of a trained part must be trainable. Parameters the
  freeze saw are recognised by identity, so a hook that wraps or renames (``torch.compile``) hides none;
- a parameter a hook added may train in a frozen part when a PEFT hook ran (LoRA's adapters: trainable =
  adapters + full-rank parts, exactly) or every part is frozen. A new tensor under the name of a
  base parameter (a hook that replaced the weight) is not an adapter: it is the base weight, and must be
  frozen in a frozen part;
- a trainable parameter a hook added that no prefix of the family covers (a new head) is a violation:
  the plugin cannot tell which part it belongs to, so it cannot promise it was asked for;
- a hook may NARROW a trained part: freeze some of its parameters (a trainer's ``freeze_moe_router`` hook
  freezes the MoE routers of the language model) while others of that part still train at full rank. That
  is accepted and reported per part, with the hook (:func:`narrowed`); a hook that freezes a trained part
  WHOLE is a violation (what was asked does not train at all);
- what a hook took away counts as much as what it added: a parameter a hook added that trained after that
  hook (an adapter of a first PEFT hook) and is frozen at the end (a second PEFT hook froze the whole model
  again) is a violation (:func:`lost`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bridge_freeze_plugin.errors import FreezeGuaranteeError, Violation
from bridge_freeze_plugin.prewrap._adapters import is_peft_hook
from bridge_freeze_plugin.prewrap._classify import Classifier, named_parameters
from bridge_freeze_plugin.prewrap._context import BuildContext
from bridge_freeze_plugin.request import Part

__all__ = ["FreezeGuaranteeError", "Violation", "describe", "violations"]

_SHOWN = 12


def _judge(name: str, param: Any, classifier: Classifier, context: BuildContext, adapters: bool) -> str | None:
    """Why ``param`` departs from the selection, or ``None`` when it does not."""
    selection = context.selection
    trains = bool(param.requires_grad)
    known = classifier.known(param)
    part = classifier.part(name, param)
    if part is None:
        return None if known or not trains else "added by a hook under no prefix of the family, and trains"
    expected = context.wants_trainable(classifier.bare_name(name, param), part, param)
    if expected is None or trains == expected:
        return None
    if not trains:
        return _FROZEN_IN_TRAINED
    if known:
        return "trains, but its part is frozen"
    if classifier.names_a_known_parameter(name):
        return "replaced by a hook and trains in a frozen part"
    if adapters or selection.freezes_all(context.parts):
        return None  # an adapter (a PEFT hook ran, or LoRA over a fully frozen model)
    return "added by a hook and trains in a frozen part"


def trained_additions(model: Any, classifier: Classifier) -> dict[int, str]:
    """id -> name of every parameter the hooks added (the freeze never saw it) that trains now."""
    return {id(p): n for _, n, p in named_parameters(model) if p.requires_grad and not classifier.known(p)}


def lost(model: Any, added: dict[int, str]) -> list[Violation]:
    """Parameters that trained after the hook that added them and are frozen now."""
    return [Violation(name, False, "was added by a hook and trained after it, but a later hook froze it")
            for _, name, param in named_parameters(model) if id(param) in added and not param.requires_grad]


_FROZEN_IN_TRAINED = "is frozen, but its part was selected to train"


def narrowed(model: Any, context: BuildContext, classifier: Classifier) -> dict[int, tuple[str, Part]]:
    """id -> (name, part) of the parameters a hook froze inside a part that still trains at full rank (with no
    flag set too: the report notes a router-freezing hook then as well, which the guarantee does not judge)."""
    frozen: dict[int, tuple[str, Part]] = {}
    still_training: set[Part] = set()
    for _, name, param in named_parameters(model):
        part = classifier.part(name, param)
        if part is None or not classifier.known(param):
            continue
        if context.wants_trainable(classifier.bare_name(name, param), part, param) is not True:
            continue
        if param.requires_grad:
            still_training.add(part)
        else:
            frozen[id(param)] = (name, part)
    return {key: value for key, value in frozen.items() if value[1] in still_training}


def violations(
    model: Any, context: BuildContext, classifier: Classifier, *, adapters: bool = False,
    added: dict[int, str] | None = None,
) -> list[Violation]:
    if not context.selection.any_set:
        return []
    found = lost(model, added or {})
    allowed = narrowed(model, context, classifier)
    for _, name, param in named_parameters(model):
        why = _judge(name, param, classifier, context, adapters)
        if why == _FROZEN_IN_TRAINED and id(param) in allowed:
            continue  # narrowed by a hook inside a part that still trains: reported, not refused
        if why is not None:
            found.append(Violation(name, bool(param.requires_grad), why))
    # What the selection asked to train but is frozen comes first: that is what users lose.
    found.sort(key=lambda v: v.requires_grad)
    return found


def describe(found: Sequence[Violation], context: BuildContext, culprit: Any | None) -> str:
    """The guarantee error's message: what was asked, what disagrees, which hook, and what to do."""
    assert context.family is not None
    shown = "; ".join(f"{v.name} ({v.why})" for v in found[:_SHOWN])
    more = f"; and {len(found) - _SHOWN} more" if len(found) > _SHOWN else ""
    if culprit is None:
        cause = " No pre-wrap hook changed it after the plugin's freeze."
        hint = " Please report this as a bridge-freeze-plugin bug."
    else:
        from bridge_freeze_plugin.prewrap._adapters import hook_name

        cause = f" The trainable set first departed from the selection after pre-wrap hook {hook_name(culprit)}."
        hint = (
            " It looks like a PEFT hook the plugin could not find a megatron.bridge PEFT object in (the plugin "
            "restores the full-rank parts after Bridge's own PEFT hook, or a PEFT object registered as the hook); "
            "register the PEFT object itself as the pre-wrap hook, or set the flags of every part it freezes."
            if is_peft_hook(culprit)
            else " Remove or reorder that hook, or change the freeze flags."
        )
    flags = ", ".join(f"{f}=True" for f in context.selection.set_flags())
    return (
        f"{flags} on {context.provider_label} (family {context.family.name}) promised "
        f"'{context.describe()}', but after the pre-wrap hooks {len(found)} parameter(s) disagree: "
        f"{shown}{more}.{cause}{hint}"
    )


def check(
    model: Any, context: BuildContext, classifier: Classifier, culprit: Any | None, *, adapters: bool = False,
    added: dict[int, str] | None = None,
) -> None:
    """Raise :class:`FreezeGuaranteeError` if the trainable set departs from the selection."""
    found = violations(model, context, classifier, adapters=adapters, added=added)
    if found:
        raise FreezeGuaranteeError(describe(found, context, culprit), found)
