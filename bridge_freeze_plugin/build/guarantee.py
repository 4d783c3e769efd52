"""The build-time guarantee: after every pre-wrap hook has run, what trains is what was asked.

Other pre-wrap hooks run after the plugin's freeze: HF weight loading, Bridge's PEFT hook (which
freezes the WHOLE base model before adding adapters), anything a user registered. The hook chain
built here runs them one by one, notes the first hook after which the trainable set departs from the
selection, and raises :class:`FreezeGuaranteeError` naming the parameters and that hook.

Rules, while any flag is set (with no flag set the plugin promises nothing beyond "nothing frozen by a
provider default", and other hooks such as plain LoRA decide):

- a parameter of a frozen part must be frozen; one of a trained part must be trainable;
- a parameter a hook added (LoRA adapters) may train in a frozen part only when all three parts are
  frozen: LoRA over a frozen model, the one LoRA case validation accepts. A new tensor under the name of
  a base parameter (a hook that replaced the weight; PEFT's ``to_wrap`` segment ignored) is not an
  adapter: it is the base weight, and must be frozen in a frozen part.

(All three frozen with no adapter trains nothing; that is what was asked, and config validation is
where it is refused.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bridge_freeze_plugin.errors import BridgeFreezeError
from bridge_freeze_plugin.freeze import as_chunks, iter_named_parameters
from bridge_freeze_plugin.registry import FamilySpec
from bridge_freeze_plugin.selection import FreezeSelection, Part

Hook = Callable[[list[Any]], Any]
_SHOWN = 12


@dataclass(frozen=True)
class Violation:
    name: str
    requires_grad: bool
    why: str


class FreezeGuaranteeError(BridgeFreezeError, RuntimeError):
    """After the pre-wrap hooks ran, the trainable parameters are not what the selection promised.

    ``violations`` lists every disagreeing parameter (the message shows the first few).
    """

    def __init__(self, message: str, violations: Sequence[Violation] = ()) -> None:
        super().__init__(message)
        self.violations: tuple[Violation, ...] = tuple(violations)


def hook_name(hook: Any) -> str:
    target = getattr(hook, "func", hook)  # functools.partial
    module = getattr(target, "__module__", None) or type(target).__module__
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}.{qualname}"


def _expected(part: Part | None, selection: FreezeSelection) -> bool | None:
    if part is None or part is Part.OTHER:
        return None  # not governed by a flag
    return part not in selection.frozen_parts()


#: Module names that PEFT wrappers insert in a wrapped parameter's name (Bridge's LoRA keeps the base
#: linear as ``<target>.to_wrap``): ``a.linear_qkv.to_wrap.weight`` is the base ``a.linear_qkv.weight``.
WRAPPER_SEGMENTS = frozenset({"to_wrap"})


def base_name(name: str) -> str:
    """``name`` without the segments PEFT wrappers insert."""
    return ".".join(part for part in name.split(".") if part not in WRAPPER_SEGMENTS)


@dataclass(frozen=True)
class Snapshot:
    """The parameters present after the plugin's own freeze: their identities and (base) names."""

    ids: frozenset[int]
    names: frozenset[str]


def snapshot(model: Any) -> Snapshot:
    params = [(name, p) for _, name, p in iter_named_parameters(as_chunks(model))]
    return Snapshot(frozenset(id(p) for _, p in params), frozenset(base_name(n) for n, _ in params))


def violations(model: Any, family: FamilySpec, selection: FreezeSelection, base: Snapshot) -> list[Violation]:
    if not selection.any_set:
        return []
    found: list[Violation] = []
    seen: set[int] = set()
    for _, name, param in iter_named_parameters(as_chunks(model)):
        if id(param) in seen:
            continue
        seen.add(id(param))
        expected = _expected(family.classify(name), selection)
        if expected is None or param.requires_grad == expected:
            continue
        added = id(param) not in base.ids
        replaced = added and base_name(name) in base.names  # a new tensor under a base parameter's name
        if added and not replaced and param.requires_grad and selection.all_set:
            continue  # an adapter over a fully frozen model (LoRA, all three flags)
        if param.requires_grad:
            why = ("replaced by a hook and trains in a frozen part" if replaced
                   else "added by a hook and trains in a frozen part" if added
                   else "trains, but its part is frozen")
        else:
            why = "is frozen, but its part was selected to train"
        found.append(Violation(name, bool(param.requires_grad), why))
    # What the selection asked to train but is frozen comes first: that is what users lose.
    found.sort(key=lambda v: v.requires_grad)
    return found


def describe(
    found: Sequence[Violation], selection: FreezeSelection, provider_label: str, family: FamilySpec,
    culprit: str | None,
) -> str:
    shown = "; ".join(f"{v.name} ({v.why})" for v in found[:_SHOWN])
    more = f"; and {len(found) - _SHOWN} more" if len(found) > _SHOWN else ""
    flags = ", ".join(f"{f}=True" for f in selection.set_flags())
    cause = (
        f" The trainable set first departed from the selection after pre-wrap hook {culprit}."
        if culprit
        else " No pre-wrap hook changed it after the plugin's freeze."
    )
    if culprit and "peft" in culprit.lower():
        peft_hint = (
            " Bridge's PEFT/LoRA hook freezes the whole base model before adding adapters: LoRA is only "
            "supported with no freeze flag or with all three set; drop LoRA or set all three flags."
        )
    elif culprit:
        peft_hint = " Remove or reorder that hook, or change the freeze flags."
    else:
        peft_hint = " Please report this as a bridge-freeze-plugin bug."
    return (
        f"{flags} on {provider_label} (family {family.name}) promised '{selection.describe()}', but after the "
        f"pre-wrap hooks {len(found)} parameter(s) disagree: {shown}{more}.{cause}{peft_hint}"
    )


class GuardedHookChain:
    """``hooks`` run in order, then the guarantee. ``before`` runs first (the plugin's own freeze)."""

    def __init__(
        self,
        before: Hook,
        hooks: Sequence[Hook],
        context: Callable[[], tuple[FamilySpec, FreezeSelection, str] | None],
        after: Callable[[Any], None] | None = None,
    ) -> None:
        self.before = before
        self.hooks = list(hooks)
        self.context = context
        self.after = after

    def __call__(self, model: Any) -> Any:
        out = self.before(model)
        model = model if out is None else out
        ctx = self.context()
        base = snapshot(model) if ctx else Snapshot(frozenset(), frozenset())
        culprit: str | None = None
        for hook in self.hooks:
            out = hook(model)
            model = model if out is None else out
            if ctx and culprit is None and violations(model, ctx[0], ctx[1], base):
                culprit = hook_name(hook)
        if ctx:
            family, selection, label = ctx
            found = violations(model, family, selection, base)
            if found:
                raise FreezeGuaranteeError(describe(found, selection, label, family, culprit), found)
        if self.after is not None:
            self.after(model)
        return model
