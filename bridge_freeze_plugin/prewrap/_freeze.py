"""The pre-wrap freeze: classify every parameter by the family's prefixes and set ``requires_grad``.

Runs on bare model chunks (a list for virtual pipeline, or one module) before Float16Module and the
DDP wrap, so DDP allocates no gradient buffer and the optimizer keeps no state for frozen weights.
Generic: everything family-specific comes from the :class:`~bridge_freeze_plugin.families.FamilySpec`.
"""

from __future__ import annotations

import logging
from typing import Any

from bridge_freeze_plugin.errors import InvalidFreezeConfigError, UnclassifiedParameterError, some_of
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.prewrap._classify import Classifier, as_chunks, named_parameters
from bridge_freeze_plugin.prewrap._context import BuildContext
from bridge_freeze_plugin.prewrap._counting import PartTally, tally_parameters
from bridge_freeze_plugin.prewrap._model_names import model_wide_names, names_are_model_wide
from bridge_freeze_plugin.prewrap._report import DefaultOverride, FreezeReport
from bridge_freeze_plugin.prewrap._running_stats import keep_frozen_stats
from bridge_freeze_plugin.prewrap._state import ChunkState, chunk_state, set_chunk_state
from bridge_freeze_plugin.ranks import is_rank0
from bridge_freeze_plugin.request import FreezeSelection, PatternSummary, PatternTally, check_matched

logger = logging.getLogger("bridge_freeze_plugin")

_MAX_NAMES_IN_ERROR = 20
_MAX_ROUTERS_IN_ERROR = 4

#: Set on every parameter the freeze classifies: its part's name (``"language_model"``...,
#: ``"other"``). An attribute survives Float16Module, DDP and renaming wrappers (identity is kept), so
#: optimizer parameter groups can match on it (``megatron.core.optimizer.ParamKey(attr=...)``).
PART_ATTR = "bridge_freeze_part"


def freeze_chunks(model: Any, context: BuildContext) -> tuple[FreezeReport, Classifier]:
    """Freeze what ``context.selection`` asks for, make the family's other parts trainable.

    Every parameter of a frozen part gets ``requires_grad=False``; every parameter of a trained part gets
    ``requires_grad=True`` (so whatever ran before, what trains is exactly what was asked). Parameters
    under ``other`` prefixes are left as they are. While any flag is set, a parameter under no prefix of
    the family raises :class:`UnclassifiedParameterError` listing the names. Idempotent.
    With train / freeze patterns, parameters are remembered under their model-wide names (what patterns
    match) and, when this rank holds the whole model, a pattern that matches nothing raises here
    (:class:`UnmatchedPatternError`; otherwise the model-wide report checks it, see :mod:`.model_wide`).
    Returns the report and the classifier that remembers each parameter's part by identity.
    """
    family, selection = context.family, context.selection
    assert family is not None
    chunks = as_chunks(model)
    classifier = Classifier(family)
    wide = model_wide_names(chunks) if selection.patterns else {}
    located: list[str] = []
    classified = []
    for index, local_name, param in named_parameters(chunks):
        name = wide.get(id(param), local_name)
        ((_, part, _),) = classifier.remember([(name, param)])
        classified.append((name, part, param))
        if part is None:
            located.append(f"chunk {index}: {name}" if len(chunks) > 1 else name)
    if located and selection.any_set:
        raise _unclassified(located, context)

    decided: dict[int, bool] = {}
    for name, part, param in classified:
        if part is not None:
            setattr(param, PART_ATTR, part.value)
        wanted = context.wants_trainable(name, part, param)
        if wanted is not None:
            param.requires_grad_(wanted)
            decided[id(param)] = wanted
    freeze_expert_biases(chunks, decided, context)
    kept = keep_frozen_stats(chunks, lambda name, module: _stats_frozen(name, module, decided, context))
    if kept:
        logger.debug("bridge-freeze: %d running-statistics module(s) of frozen parts run in eval mode", kept)
    for chunk in chunks:
        state = chunk_state(chunk)
        if state is None or state.selection != selection or state.family != family.name:
            set_chunk_state(chunk, ChunkState(selection, family.name))
    summary = pattern_summary(context, classified)
    if summary is not None and names_are_model_wide():
        check_matched(summary, context.asked, (name for name, _, _ in classified))
    report = context.report(tally_parameters((part, param) for _, part, param in classified), summary)
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("bridge-freeze applied to %d chunk(s):\n%s", len(chunks), report.format())
    return report, classifier


def freeze_expert_biases(chunks: list[Any], decided: dict[int, bool], context: BuildContext) -> int:
    """A MoE router's ``expert_bias`` is frozen with its router (how many routers were frozen).

    megatron-core's ``finalize_model_grads`` updates that buffer after every step from the token counts, with no
    gradient (``bias + sign(mean - tokens) * moe_router_bias_update_rate``): a frozen language model's routing would
    still change. A router whose ``weight`` the selection freezes gets ``frozen_expert_bias = True`` (megatron-core
    0.19+); one whose weight trains keeps Bridge's setting. megatron-core 0.18 (SkyRL's pin) has no
    ``frozen_expert_bias`` and moves every training router's bias by its config's rate: when every router of these
    chunks is frozen, that rate is set to 0 on the configs ``finalize_model_grads`` reads (the update then adds
    exactly 0); frozen and moving routers together cannot be honoured there and raise
    :class:`InvalidFreezeConfigError`. Per rank, as the update is (a pipeline stage updates its own routers).
    """
    frozen, moving = _routers(chunks, decided)
    for _, router in frozen:
        if hasattr(router, "frozen_expert_bias"):
            router.frozen_expert_bias = True
    unflagged = [name for name, router in frozen if not hasattr(router, "frozen_expert_bias")]
    configs = _bias_configs(chunks, [router for _, router in frozen])
    if not unflagged or not any(expert_bias_moves(config) for config in configs):
        return len(frozen)
    if moving:
        raise _mixed_routers(unflagged, [name for name, _ in moving], context)
    rates = sorted({float(config.moe_router_bias_update_rate) for config in configs if expert_bias_moves(config)})
    for config in configs:
        if hasattr(config, "moe_router_bias_update_rate"):
            config.moe_router_bias_update_rate = 0.0
    if is_rank0():
        logger.info(
            "bridge-freeze: all %d MoE router(s) with an expert bias are frozen and this megatron-core has no "
            "frozen_expert_bias: moe_router_bias_update_rate %s -> 0.0 on %d model config(s), so "
            "finalize_model_grads leaves their expert bias as loaded", len(unflagged),
            "/".join(f"{rate:g}" for rate in rates), len(configs))
    return len(frozen)


def _routers(chunks: list[Any], decided: dict[int, bool]) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """The routers with an expert bias, as (name, module): those whose weight the selection freezes, and the
    others whose bias megatron-core moves (no ``frozen_expert_bias`` set)."""
    frozen, moving = [], []
    for index, chunk in enumerate(chunks):
        for name, module in chunk.named_modules():
            weight = getattr(module, "weight", None)
            if getattr(module, "expert_bias", None) is None or weight is None:
                continue
            named = (f"chunk {index}: {name}" if len(chunks) > 1 else name, module)
            if decided.get(id(weight)) is False:
                frozen.append(named)
            elif not getattr(module, "frozen_expert_bias", False):
                moving.append(named)
    return frozen, moving


def _bias_configs(chunks: list[Any], routers: list[Any]) -> list[Any]:
    """Every distinct config that can say how an expert bias moves: each chunk's (what ``finalize_model_grads``
    reads, ``get_model_config(model[0])``: Bridge's provider) and each router's (a copy, for some models)."""
    found = {id(c): c for c in (getattr(m, "config", None) for m in [*chunks, *routers]) if c is not None}
    return list(found.values())


def expert_bias_moves(config: Any) -> bool:
    """Whether megatron-core's ``finalize_model_grads`` moves the expert bias of a router with model config
    ``config`` (before ``frozen_expert_bias``, which the router itself carries): the bias is on, its rate non-zero."""
    return bool(getattr(config, "moe_router_enable_expert_bias", False)
                and getattr(config, "moe_router_bias_update_rate", 0))


def _mixed_routers(frozen: list[str], moving: list[str], context: BuildContext) -> InvalidFreezeConfigError:
    return InvalidFreezeConfigError(
        f"{context.asked} freezes {len(frozen)} MoE router(s) with an expert bias "
        f"({some_of(frozen, _MAX_ROUTERS_IN_ERROR)}) while "
        f"{len(moving)} other router(s) train (e.g. {', '.join(moving[:2])}), but this megatron-core has no "
        f"frozen_expert_bias: its finalize_model_grads moves every router's expert bias by one "
        f"moe_router_bias_update_rate, so the frozen routers' routing would still change. Freeze or train all "
        f"routers alike, set moe_router_bias_update_rate=0 on the provider (then no expert bias moves), or use "
        f"megatron-core 0.19 or newer (it has frozen_expert_bias)."
    )


def _stats_frozen(name: str, module: Any, decided: dict[int, bool], context: BuildContext) -> bool | None:
    """Whether a running-statistics module belongs to what the selection freezes (``None``: not governed).

    By its own parameters when it has any (an affine BatchNorm: frozen when none of them trains), else by its
    name's part."""
    own = [decided[id(p)] for p in module.parameters(recurse=False) if id(p) in decided]
    if own:
        return not any(own)
    assert context.family is not None
    probe = f"{name}.running_mean"
    wanted = context.wants_trainable(probe, context.family.classify(probe))
    return None if wanted is None else not wanted


def pattern_summary(context: BuildContext, classified: Any) -> PatternSummary | None:
    """What the selection's patterns match among ``(model-wide name, part, parameter)``; ``None`` without any."""
    if not context.selection.patterns:
        return None
    tally = PatternTally(context.selection.patterns, context.selection.frozen_parts(), context.parts)
    seen: set[int] = set()
    for name, part, param in classified:
        if id(param) not in seen:
            seen.add(id(param))
            tally.add(name, part, int(param.numel()))
    return tally.summary()


def _unclassified(located: list[str], context: BuildContext) -> UnclassifiedParameterError:
    assert context.family is not None
    return UnclassifiedParameterError(
        f"{', '.join(f'{f}=True' for f in context.selection.set_flags())} was asked of "
        f"{context.provider_label or 'the model'}{f' ({context.model_name})' if context.model_name else ''}, but "
        f"{len(located)} parameter(s) fall under no prefix of family {context.family.name!r}, so the "
        f"plugin cannot tell which part they belong to: {some_of(located, _MAX_NAMES_IN_ERROR)}. Add their module "
        f"to the "
        f"family's table ({' / '.join([*(p.value for p in context.family.part_names()), 'other'])}), or unset "
        f"the freeze flags."
    )


def apply_selection(
    model: Any,
    family: FamilySpec,
    selection: FreezeSelection,
    *,
    provider_name: str = "",
    model_name: str | None = None,
    overridden_defaults: tuple[DefaultOverride, ...] = (),
) -> FreezeReport:
    """Apply ``selection`` to ``model`` (one module or a list of chunks) by ``family``'s prefixes; the report.

    The public form of :func:`freeze_chunks`, for a model built without a provider (or by hand). A family with a
    layout per provider class is read by the table the model's own parameter names fit (there is no provider
    class to ask): Nemotron Omni's top-level tree on Bridge 0.7.0, its LLaVA tree on 0.6.2.
    """
    family = family.for_model(name for _, name, _ in named_parameters(as_chunks(model)))
    context = BuildContext(family, selection, provider_name, model_name, tuple(overridden_defaults))
    return freeze_chunks(model, context)[0]


def count_parts(model: Any, context: BuildContext, classifier: Classifier | None = None) -> FreezeReport:
    """The per-part report of ``model`` as it is now (changes nothing)."""
    assert context.family is not None
    classifier = classifier or Classifier(context.family)
    tally = PartTally()
    for _, name, param in named_parameters(model):
        trains = bool(param.requires_grad)
        adapter = trains and not classifier.known(param)  # added by a hook (LoRA): not a base weight
        tally.add(classifier.part(name, param), int(param.numel()), trains, adapter=adapter)
    return context.report(tally, pattern_summary(context, classifier.remembered()))


def claim_report(model: Any) -> bool:
    """True the first time it is asked for these chunks: the caller then logs the report."""
    states = [chunk_state(c) for c in as_chunks(model)]
    if any(s is None for s in states) or all(s.reported for s in states):  # type: ignore[union-attr]
        return False
    for state in states:
        state.reported = True  # type: ignore[union-attr]
    return True
