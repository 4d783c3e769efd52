"""The pre-wrap hook the plugin hands Bridge: its freeze first, every other hook, then the guarantee.

Bridge's ``provide_distributed_model`` runs one ``pre_wrap_hook`` on the bare chunks before Float16Module
and DDP. The plugin gives it a :class:`HookChain` holding the hooks Bridge would have run (registered with
``register_pre_wrap_hook`` or passed as ``pre_wrap_hook=``), in their order:

1. the plugin's freeze on every chunk;
2. each hook, noting the first after which the trainable set departs from the selection;
   right after a PEFT (LoRA) hook, the full-rank parts are restored and checked for overlap (:mod:`.lora`);
3. the guarantee (:mod:`.guarantee`); then every rank agrees on errors (:mod:`.collective`);
4. the model-wide report (the same on every rank), stored on the provider and logged once by rank 0;
5. a build wrapped for training (the first of its provider) goes to the build listeners: the run-time audit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from bridge_freeze_plugin.errors import EmptyPartError, NothingTrainsError, PartNotInFamilyError
from bridge_freeze_plugin.prewrap import _guarantee as guarantee
from bridge_freeze_plugin.prewrap import _model_wide
from bridge_freeze_plugin.prewrap import _recompute_fix as recompute_fix
from bridge_freeze_plugin.prewrap._adapters import hook_name
from bridge_freeze_plugin.prewrap._classify import Classifier, as_chunks
from bridge_freeze_plugin.prewrap._collective import run_agreed
from bridge_freeze_plugin.prewrap._context import BuildContext
from bridge_freeze_plugin.prewrap._freeze import claim_report, count_parts, freeze_chunks
from bridge_freeze_plugin.prewrap._lora import after_peft, find_peft
from bridge_freeze_plugin.prewrap._lora_reach import unadaptable_error
from bridge_freeze_plugin.prewrap._model_wide import model_wide_report, store_report
from bridge_freeze_plugin.prewrap._report import FreezeReport, log_report
from bridge_freeze_plugin.prewrap._state import STATE, TrainingBuild, provider_state
from bridge_freeze_plugin.prewrap._subclass_build import addition_notes
from bridge_freeze_plugin.request import INFO, check_lora_targets, label

Hook = Callable[[list[Any]], Any]

#: The name of the mixin's own pre-wrap hook method (users may register it; the chain runs it once).
OWN_HOOK_METHOD = "bridge_freeze_pre_wrap_hook"


def user_hooks(provider: Any, explicit: Any = None) -> list[Hook]:
    """The hooks Bridge would run: ``explicit`` (``pre_wrap_hook=``) replaces the registered ones."""
    if explicit is None:
        hooks = list(getattr(provider, "_pre_wrap_hooks", None) or [])
    else:
        hooks = list(explicit) if isinstance(explicit, (list, tuple)) else [explicit]
    return [h for h in hooks if not _is_own_hook(h, provider)]


def _is_own_hook(hook: Any, provider: Any) -> bool:
    return getattr(hook, "__self__", None) is provider and getattr(hook, "__name__", "") == OWN_HOOK_METHOD


@contextlib.contextmanager
def model_wide_checks_skipped() -> Iterator[None]:
    """The two model-wide verdicts skipped while inside: every selected part has parameters somewhere
    (:func:`check_parts_present`) and every pattern matches somewhere (``check_matched`` in :mod:`._model_wide`).
    For a build of one rank of many whose counts no all-reduce brings (``bridge-freeze plan``'s per-rank builds,
    after the whole-model build gave both verdicts); every per-rank check stays."""
    module = sys.modules[__name__]
    saved = module.check_parts_present, _model_wide.check_matched
    module.check_parts_present = lambda *_args, **_kwargs: None  # type: ignore[attr-defined]
    _model_wide.check_matched = lambda *_args, **_kwargs: None  # type: ignore[assignment]
    try:
        yield
    finally:
        module.check_parts_present, _model_wide.check_matched = saved  # type: ignore[attr-defined]


def check_parts_present(report: FreezeReport, context: BuildContext) -> None:
    """While a flag is set, each of the family's parts must have parameters in the whole model: a vision-language
    part always (else the family's table is wrong), any other part (an audio encoder) when its flag is set (a model
    may be built without it: then that flag cannot be honoured)."""
    if not context.selection.any_set or context.family is None:
        return
    frozen = context.selection.frozen_parts()
    empty = [p for p in context.family.part_names()
             if not report.part(p).total_tensors and (INFO[p].assumed or p in frozen)]
    unbuilt = [p for p in empty if not INFO[p].assumed]
    if unbuilt:
        flags = ", ".join(f"{INFO[p].flag}=True" for p in unbuilt)
        raise PartNotInFamilyError(
            f"{flags} on {context.provider_label or 'the model'}"
            f"{f' ({context.model_name})' if context.model_name else ''}: family {context.family.name!r} can have "
            f"{' and '.join(label(p) for p in unbuilt)}, but this model was built without one (its config has none: "
            f"no audio config, or the provider's own switch off), so the flag cannot freeze anything. Unset "
            f"{', '.join(INFO[p].flag for p in unbuilt)}."
        )
    if empty:
        family = context.family
        tables = "; ".join(f"{p.value}: {', '.join(family.prefixes(p))}" for p in empty)
        raise EmptyPartError(
            f"{context.asked}: the model built for family {family.name!r} has no parameter at all in "
            f"{', '.join(p.value for p in empty)} (prefixes {tables}), so the selection cannot mean what it says: "
            f"the family's table is almost certainly wrong for this model. Compare its prefixes with the model's "
            f"parameter names (bridge-freeze plan --json lists them) and fix the table, or unset the flags."
        )


def check_something_trains(report: FreezeReport, context: BuildContext) -> None:
    """A build wrapped for training must train something: refused, model-wide (the same verdict on every rank), when
    the flags and patterns leave no trainable parameter and no hook added one (the config rules refuse the flags'
    case before any build; patterns and a trainer's own keys can only be judged here)."""
    if context.untrained is not None or context.family is None or report.trainable or not report.total:
        return
    raise NothingTrainsError(  # what was asked names the flags and the patterns
        f"{context.asked}: the model built for training has no trainable parameter ({report.total:,} "
        f"parameters, all frozen), so nothing would train and Bridge's optimizer would have no parameter group. "
        f"Unset a freeze flag, narrow the freeze patterns (or add a train pattern), or add LoRA adapters."
    )


def _trained_ids(model: Any) -> set[int]:
    return {id(p) for chunk in as_chunks(model) for p in chunk.parameters() if p.requires_grad}


def _with_narrowing_notes(
    context: BuildContext, model: Any, narrowing: dict[int, tuple[str, Any, str]]
) -> BuildContext:
    """One report note per (hook, part) that froze tensors inside a trained part (still frozen at the end)."""
    still = {id(p) for chunk in as_chunks(model) for p in chunk.parameters() if not p.requires_grad}
    grouped: dict[tuple[str, str], list[str]] = {}
    for key, (name, part, hook) in narrowing.items():
        if key in still:
            grouped.setdefault((hook, part.value), []).append(name)
    notes = tuple(
        f"{part}: {len(names)} tensor(s) frozen by pre-wrap hook {hook} inside a part that trains "
        f"(narrowed, e.g. {', '.join(sorted(names)[:3])})"
        for (hook, part), names in sorted(grouped.items())
    )
    return dataclasses.replace(context, notes=(*context.notes, *notes)) if notes else context


class HookChain:
    """The plugin's pre-wrap hook for one build (see the module docstring)."""

    def __init__(self, provider: Any, context: BuildContext, hooks: Sequence[Hook]) -> None:
        self.provider = provider
        self.context = context
        self.hooks = list(hooks)

    def _run(self, model: Any) -> tuple[Any, Classifier | None]:
        classifier = None
        if self.context.family is not None:
            _, classifier = freeze_chunks(model, self.context)
        culprit: Hook | None = None
        adapters = False  # a PEFT hook ran: trainable parameters it added are adapters
        added: dict[int, str] = {}  # what hooks added and trained after them (a later hook must not freeze it)
        narrowing: dict[int, tuple[str, Any, str]] = {}  # id -> (name, part, hook) frozen inside a trained part
        for hook in self.hooks:
            peft = find_peft(hook) if classifier is not None else None
            if peft is not None:  # Bridge matches targets as unbounded regexes: refuse a hanging one first
                check_lora_targets(getattr(peft, "target_modules", None) or ())
                check_lora_targets(getattr(peft, "exclude_modules", None) or (), "exclude_modules")
            before = _trained_ids(model) if peft is not None else None
            try:
                out = hook(model)
            except (NotImplementedError, AttributeError) as exc:  # Bridge's LoRA on a module it cannot adapt
                if peft is None:
                    raise
                raise unadaptable_error(model, peft, hook_name(hook), self.context.asked, exc) from exc
            model = model if out is None else out
            if classifier is None:
                continue
            if peft is not None:
                adapters = True
                after_peft(model, self.context, classifier, peft, hook_name(hook), before)
            found = guarantee.violations(model, self.context, classifier, adapters=adapters, added=added)
            if culprit is None and found:
                culprit = hook
            added.update(guarantee.trained_additions(model, classifier))
            for key, (name, part) in guarantee.narrowed(model, self.context, classifier).items():
                narrowing.setdefault(key, (name, part, hook_name(hook)))
        if classifier is not None:
            guarantee.check(model, self.context, classifier, culprit, adapters=adapters, added=added)
            self.context = recompute_fix.after_hooks(model, self.provider, self.context)
            self.context = _with_narrowing_notes(self.context, model, narrowing)
            kept = addition_notes(model, self.context)
            if kept:
                self.context = dataclasses.replace(self.context, notes=(*self.context.notes, *kept))
        return model, classifier

    def __call__(self, model: Any) -> Any:
        model, classifier = run_agreed(lambda: self._run(model))  # an error on any rank stops every rank
        if classifier is not None:
            report = model_wide_report(model, count_parts(model, self.context, classifier), classifier)
            check_parts_present(report, self.context)  # model-wide: the same verdict on every rank
            check_something_trains(report, self.context)
            store_report(self.provider, report)
            if claim_report(model):
                log_report(report)
            if self.context.untrained is None:
                if self.context.repeat is None:
                    build = TrainingBuild(self.provider, as_chunks(model), classifier, self.context, report)
                    for listener in list(STATE.build_listeners):
                        listener(build)  # the run-time audit arms here (every rank, in step)
                provider_state(self.provider).training_builds += 1
        return model

    def __repr__(self) -> str:
        return f"<bridge-freeze pre-wrap hook chain of {self.context.provider_label} ({len(self.hooks)} hook(s))>"
