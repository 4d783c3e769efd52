"""Full activation recompute where it gives wrong gradients: fixed in the modules that break, not refused.

On some families full activation recompute gives wrong gradients to some parts (family data:
``FamilySpec.no_full_recompute``, the modules where it breaks; ``full_recompute_affects``, the parts whose
gradients it gets wrong; ``recompute_note``, why). When such a part trains under
``recompute_granularity="full"`` (any ``recompute_method``), the plugin turns recompute off in those modules'
own (private copies of their) configs, before any forward; the rest of the model keeps its full recompute. The
report says so in one line. The decision is made twice: before the build from the flags and patterns, and
again at the end of the pre-wrap hooks from what actually trains (LoRA adapters inside a frozen vision
tower train too, and so need the fix: :func:`trains_affected`).

A user who prefers the old behaviour sets ``full_recompute_policy = "refuse"`` on the provider: a flag
set with an affected part training under full recompute is then an error before any build.
Selective recompute checkpoints inside attention only: left as it is.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from bridge_freeze_plugin.errors import InvalidFreezeConfigError
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.prewrap._adapters import base_name
from bridge_freeze_plugin.prewrap._classify import as_chunks
from bridge_freeze_plugin.prewrap._recompute import affected_parts, is_full
from bridge_freeze_plugin.request import FreezeSelection

if TYPE_CHECKING:
    from bridge_freeze_plugin.prewrap._context import BuildContext

logger = logging.getLogger("bridge_freeze_plugin")

#: Provider attribute choosing what happens: "fix" (default) or "refuse".
POLICY_ATTR = "full_recompute_policy"
#: Its former name, still read (it also covers Ernie's language model, not only vision towers).
FORMER_POLICY_ATTR = "vision_recompute_policy"
POLICIES = ("fix", "refuse")
_RECOMPUTE_FIELDS = {"recompute_granularity": None, "recompute_method": None, "recompute_num_layers": None}


def policy_of(provider: Any) -> str:
    """The provider's policy. Under the former name too: "refuse" under either name refuses (a value that is
    "fix" cannot be told from the default, so "refuse", the explicit choice, wins)."""
    given = {attr: getattr(provider, attr, None) for attr in (POLICY_ATTR, FORMER_POLICY_ATTR)}
    for attr, policy in given.items():
        if policy is not None and policy not in POLICIES:
            raise InvalidFreezeConfigError(
                f"{attr}={policy!r} on {type(provider).__name__}: it must be one of {', '.join(POLICIES)} "
                f"('fix' turns full recompute off only where it breaks gradients; 'refuse' makes it an error)"
            )
    return "refuse" if "refuse" in given.values() else "fix"


def needs_fix(family: FamilySpec | None, selection: FreezeSelection, recompute_granularity: Any) -> bool:
    """Whether a part whose gradients full recompute gets wrong on this family trains under full recompute."""
    return is_full(recompute_granularity) and bool(affected_parts(family, selection))


def note(family: FamilySpec) -> str:
    """The report's line: what was changed, and why."""
    where = ", ".join(family.no_full_recompute)
    return (
        f"full activation recompute turned off in {where} (the rest of the model keeps it): on {family.name}, "
        f"{family.recompute_note or 'full recompute there gives wrong gradients'}"
    )


def turn_off(model: Any, family: FamilySpec) -> int:
    """Recompute off for every module under ``family.no_full_recompute``; how many configs were replaced.

    The provider's own settings are never rewritten: in Megatron a module's ``config`` is often the provider
    itself (Ernie's language model) or an object the provider holds (Qwen3-VL's vision config), and Bridge
    writes the provider to ``run_config.yaml`` and reads it again on resume. Each affected module gets a
    private copy of its config with recompute off instead (one copy per original, shared by the modules that
    shared it); modules outside those prefixes keep the original, with its full recompute.
    """
    copies: dict[int, Any] = {}
    for chunk in as_chunks(model):
        for name, module in chunk.named_modules():
            if not any(name == p or name.startswith(p + ".") for p in family.no_full_recompute):
                continue
            config = getattr(module, "config", None)
            if id(config) not in copies:
                if not is_full(getattr(config, "recompute_granularity", None)):
                    continue
                private = copy.copy(config)
                for field, value in _RECOMPUTE_FIELDS.items():
                    setattr(private, field, value)
                copies[id(config)] = private
            module.config = copies[id(config)]
    return len(copies)


def trains_affected(model: Any, family: FamilySpec) -> list[str]:
    """The parts in ``family.full_recompute_affects`` in which something trains now (adapters included).

    Decided from the model at the end of the pre-wrap hooks, by parameter name: what actually trains,
    whatever chose it (flags, patterns, LoRA adapters, a full-rank part next to them, a user's hook).
    """
    found: set[str] = set()
    affected = set(family.full_recompute_affects)
    for chunk in as_chunks(model):
        for name, param in chunk.named_parameters():
            if param.requires_grad:
                part = family.classify(base_name(name))
                if part is not None and part.value in affected:
                    found.add(part.value)
    return sorted(found)


def after_hooks(model: Any, provider: Any, context: BuildContext) -> BuildContext:
    """At the end of the pre-wrap hooks: the fix (or the refusal) for what actually trains.

    Before the build the decision could only read the flags and patterns; a PEFT hook may since have put
    adapters into a part whose gradients full recompute gets wrong. Returns the context, with the report's
    note added when the fix is applied only now.
    """
    family = context.family
    if family is None or not family.no_full_recompute:
        return context
    if not is_full(getattr(provider, "recompute_granularity", None)):
        return context
    trained = trains_affected(model, family)
    if not trained:
        return context
    if policy_of(provider) == "refuse":
        if not affected_parts(family, context.selection):  # not already refused (or warned) before the build
            raise InvalidFreezeConfigError(_refusal(context, " and ".join(trained)))
        return context
    turn_off(model, family)
    if context.vision_recompute_off:
        return context
    return dataclasses.replace(context, notes=(*context.notes, note(family)), vision_recompute_off=True)


def refuse(context: BuildContext, *, warn_only: bool, rank0: bool) -> None:
    """The "refuse" policy: an error when a flag is set, a warning (rank 0) when none is."""
    assert context.family is not None
    trained = " and ".join(affected_parts(context.family, context.selection))  # flags and train patterns
    message = _refusal(context, trained)
    if not warn_only:
        raise InvalidFreezeConfigError(message)
    if rank0:
        logger.warning("bridge-freeze: %s", message)


def _refusal(context: BuildContext, trained: str) -> str:
    family = context.family
    assert family is not None
    return (
        f"{context.asked} trains the {trained} under recompute_granularity=full, with {POLICY_ATTR}='refuse': "
        f"on the {family.name} family {family.recompute_note or 'that gives wrong gradients'}. "
        f"Let the plugin turn recompute off in {', '.join(family.no_full_recompute)} only "
        f"({POLICY_ATTR}='fix', the default), turn full recompute off (recompute_granularity=None, or selective), "
        f"or freeze those parts ({', '.join(f'freeze_{p}=True' for p in family.full_recompute_affects)}) "
        f"and keep LoRA adapters out of them."
    )
