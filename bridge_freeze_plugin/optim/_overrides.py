"""Per-part learning rates as megatron-core parameter-group overrides, checked before the optimizer is built.

:func:`part_lr_overrides` is the one call a direct ``get_megatron_optimizer`` caller (an RL trainer) makes;
Bridge's ``setup()`` reaches it through :class:`~bridge_freeze_plugin.optim.bridge.PartLROverrideProvider`.
It returns megatron-core's standard overrides (no weight decay on biases and 1-D tensors, ``decoupled_lr``)
plus one per part, matched on the part attribute the freeze sets on each parameter (names change under
wrappers, identity and attributes do not). LoRA's adapters carry no part: they are the trainable parameters
the freeze never classified.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from bridge_freeze_plugin.errors import PartLearningRateError
from bridge_freeze_plugin.optim._settings import ADAPTERS, PartLearningRates
from bridge_freeze_plugin.prewrap import PART_ATTR, chunk_state, expert_bias_moves
from bridge_freeze_plugin.request import Part, label

if TYPE_CHECKING:
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer.optimizer_config import ParamKey
    from megatron.core.optimizer_param_scheduler import ParamGroupOverride

#: megatron-core's attribute on the input embedding and output layer: ``decoupled_lr`` applies to them.
DECOUPLED_ATTR = "is_embedding_or_output_parameter"
#: Optimizers whose parameter groups megatron-core builds from the overrides (the others: unchecked ground).
SUPPORTED_OPTIMIZERS = ("adam", "sgd")


def model_chunks(model: Any) -> list[Any]:
    return list(model) if isinstance(model, list | tuple) else [model]


def parameters(model: Any) -> Iterator[Any]:
    """Every parameter of every chunk, once."""
    seen: set[int] = set()
    for chunk in model_chunks(model):
        for param in chunk.parameters():
            if id(param) not in seen:
                seen.add(id(param))
                yield param


def adapter_ids(model: Any) -> frozenset[int]:
    """Identities of LoRA's adapters: trainable parameters the freeze did not classify (a hook added them)."""
    return frozenset(id(p) for p in parameters(model) if p.requires_grad and getattr(p, PART_ATTR, None) is None)


def lr_part(param: Any, adapters: frozenset[int]) -> str | None:
    """The learning-rate part of ``param``: its freeze part, ``"adapters"``, or ``None``."""
    if id(param) in adapters:
        return ADAPTERS
    return getattr(param, PART_ATTR, None)


def decoupled(config: OptimizerConfig, param: Any) -> bool:
    """Whether megatron-core's ``decoupled_lr`` governs ``param`` (it keeps precedence over a part's LR)."""
    return config.decoupled_lr is not None and bool(getattr(param, DECOUPLED_ATTR, False))


def _in_part(param: Any, *, part: str, adapters: frozenset[int], config: OptimizerConfig) -> bool:
    return lr_part(param, adapters) == part and not decoupled(config, param)


def part_lr_overrides(
    optimizer_config: OptimizerConfig,
    model: Any,
    rates: PartLearningRates,
    *,
    lr_warmup_init: float = 0.0,
    lr_warmup_steps: int = 0,
) -> dict[ParamKey, ParamGroupOverride]:
    """megatron-core's standard overrides plus one ``{max_lr, min_lr}`` override per part with its own LR.

    ``model``: the chunks the optimizer is built for (wrapped or not), built through the plugin. Raises
    :class:`PartLearningRateError` where a part's LR could not take effect: an LR for a frozen part, a model
    the freeze never classified, an optimizer or setting under which megatron-core would not apply it.
    """
    from megatron.core.optimizer import get_standard_config_overrides
    from megatron.core.optimizer.optimizer_config import ParamKey, ParamPredicate

    overrides: dict[ParamKey, ParamGroupOverride] = dict(get_standard_config_overrides(optimizer_config))
    if not rates:
        return overrides
    check_optimizer_config(optimizer_config, model, rates)
    check_schedule(rates, lr_warmup_init, lr_warmup_steps)
    adapters = check_model(model, rates)
    resolved = rates.resolved(optimizer_config.lr, optimizer_config.min_lr)
    for part, (max_lr, min_lr) in resolved.items():
        match = functools.partial(_in_part, part=part, adapters=adapters, config=optimizer_config)
        key = ParamKey(predicate=ParamPredicate(name=f"{PART_ATTR}={part}", fn=match))
        overrides[key] = {"max_lr": max_lr, "min_lr": min_lr}
    _hold_zero_lr_parts(model, [part for part, lrs in resolved.items() if lrs == (0.0, 0.0)], adapters,
                        optimizer_config, rates)
    return overrides


def _hold_zero_lr_parts(model: Any, parts: list[str], adapters: frozenset[int], config: OptimizerConfig,
                        rates: PartLearningRates) -> None:
    """A part at learning rate 0 all along stays as loaded: its parameters are recorded on the chunks (the run-time
    audit holds them like frozen ones), and its MoE routers' expert bias is frozen as a frozen part's is
    (megatron-core's ``finalize_model_grads`` would move it with no learning rate at all)."""
    held = frozenset(id(p) for p in parameters(model)
                     if p.requires_grad and any(_in_part(p, part=part, adapters=adapters, config=config)
                                                for part in parts))
    for state in _states(model):
        state.zero_lr, state.zero_lr_parts = held, tuple(parts)
    if not held:
        return
    routers = [(name, module) for chunk in model_chunks(model) for name, module in chunk.named_modules()
               if getattr(module, "expert_bias", None) is not None and id(getattr(module, "weight", None)) in held]
    unflagged = [name for name, router in routers if not hasattr(router, "frozen_expert_bias")]
    configs = [getattr(router, "config", None) for _, router in routers]
    if unflagged and any(expert_bias_moves(c) for c in configs if c is not None):
        raise PartLearningRateError(
            f"{rates.describe()}: learning rate 0 for MoE routers with an expert bias ({', '.join(unflagged[:3])}"
            f"{' ...' if len(unflagged) > 3 else ''}), but this megatron-core has no frozen_expert_bias: its "
            f"finalize_model_grads would still move their expert bias, so the part would not stay as loaded. "
            f"Freeze the part with its flag instead, set moe_router_bias_update_rate=0 on the provider, or use "
            f"megatron-core 0.19 or newer"
        )
    for _, router in routers:
        router.frozen_expert_bias = True


def check_optimizer_config(config: OptimizerConfig, model: Any, rates: PartLearningRates) -> None:
    """Settings under which megatron-core builds its groups without the overrides, or with conflicting ones."""
    asked = rates.describe()
    if config.optimizer not in SUPPORTED_OPTIMIZERS:
        raise PartLearningRateError(
            f"per-part learning rates ({asked}) with optimizer={config.optimizer!r}: megatron-core builds that "
            f"optimizer's parameter groups its own way, and the plugin cannot vouch that a part's LR applies; use "
            f"optimizer='adam' or 'sgd', or remove the per-part learning rates"
        )
    if hasattr(config, "provide"):
        raise PartLearningRateError(
            f"per-part learning rates ({asked}) with {type(config).__name__}, an optimizer config that builds its "
            f"own optimizer (provide()): the plugin cannot vouch that a part's LR applies; use megatron-core's "
            f"OptimizerConfig, or remove the per-part learning rates"
        )
    model_config = getattr(model_chunks(model)[0], "config", None)
    if getattr(model_config, "use_mup", False):
        raise PartLearningRateError(
            f"per-part learning rates ({asked}) with use_mup=True: muP sets its own learning rate per parameter "
            f"and megatron-core refuses two for one group; turn muP off or remove the per-part learning rates"
        )


def check_schedule(rates: PartLearningRates, lr_warmup_init: float, lr_warmup_steps: int) -> None:
    """Warm-up from a non-zero start is not the global shape for a part (and breaks an LR of 0.0)."""
    if rates and lr_warmup_steps > 0 and lr_warmup_init != 0.0:
        raise PartLearningRateError(
            f"per-part learning rates ({rates.describe()}) with lr_warmup_init={lr_warmup_init:g}: megatron-core "
            f"warms every parameter group up from the same start, so a part would not follow the global "
            f"schedule's shape (a part at LR 0.0 would train during warm-up); set lr_warmup_init=0"
        )


def _states(model: Any) -> Iterator[Any]:
    """The freeze state recorded on each chunk (under Float16Module / DDP: on the module they wrap)."""
    for chunk in model_chunks(model):
        inner, state = chunk, chunk_state(chunk)
        while state is None and hasattr(inner, "module"):
            inner = inner.module
            state = chunk_state(inner)
        if state is not None:
            yield state


def _selections(model: Any) -> Iterator[Any]:
    """The freeze selection recorded on each chunk."""
    for state in _states(model):
        yield state.selection


def _untrained(model: Any) -> set[str]:
    """Parts that train nowhere by the selection: frozen by their flag, and no train pattern reaches them."""
    from bridge_freeze_plugin.registry import get_family

    out: set[str] = set()
    for state in _states(model):
        family = get_family(state.family)
        prefixes = {part: family.prefixes(part) for part in state.selection.frozen_parts()}
        out.update(part.value for part in state.selection.untrained_parts(prefixes))
    return out


def _refuse_absent_parts(model: Any, rates: PartLearningRates) -> None:
    """An LR for a part the model's family does not have (``lr_audio_model`` on a VLM) would never apply."""
    from bridge_freeze_plugin.registry import get_family

    families = {state.family: get_family(state.family) for state in _states(model)}
    has = {part.value for family in families.values() for part in family.part_names()}
    absent = [name for name in rates.names() if name != ADAPTERS and name not in has]
    if absent and families:
        names = ", ".join(families)
        raise PartLearningRateError(
            f"{', '.join(f'lr_{n}' for n in absent)} set on a {names} model, which has no "
            f"{' and '.join(label(Part(n)) for n in absent)} (its parts: "
            f"{'; '.join(f.describe_parts() for f in families.values())}): the learning rate would never apply; "
            f"remove {', '.join(f'lr_{n}' for n in absent)}")


def check_model(model: Any, rates: PartLearningRates) -> frozenset[int]:
    """The model was classified by the freeze; no LR is asked for a part that does not train. Returns the adapters.

    A part trains when one of its parameters does (``requires_grad``): a train pattern inside a part frozen by its
    flag makes it train. A part with no parameter on this rank (another pipeline stage holds it) is decided by the
    selection: frozen by its flag and reached by no train pattern.
    """
    params = list(parameters(model))
    if not any(getattr(p, PART_ATTR, None) is not None for p in params):
        raise PartLearningRateError(
            f"per-part learning rates ({rates.describe()}) on a model the plugin did not build: no parameter "
            f"carries its part ({PART_ATTR}); build the model through a provider the plugin covers "
            f"(import bridge_freeze_plugin before building), or remove the per-part learning rates"
        )
    selections = list(_selections(model))
    flagged = {part.value for selection in selections for part in selection.frozen_parts()}
    patterns = sorted({p for selection in selections for p in selection.train_patterns})
    untrained = _untrained(model)
    trained = {p for p in (getattr(q, PART_ATTR, None) for q in params if q.requires_grad) if p is not None}
    _refuse_absent_parts(model, rates)
    for part in rates.names():
        local = [q for q in params if getattr(q, PART_ATTR, None) == part]
        if (local and part not in trained) or (not local and part in untrained):
            why = f"freeze_{part}=True" if part in flagged else "freeze_patterns freeze all of it"
            if part in flagged and patterns:
                why += f" and no train pattern ({', '.join(map(repr, patterns))}) matches one of its parameters"
            raise PartLearningRateError(
                f"lr_{part} is set, but the {part} is frozen: none of its parameters trains ({why}), so its "
                f"learning rate would never apply; remove lr_{part}, or unset freeze_{part} (or add a train pattern "
                f"for the parameters of it that should train)"
            )
    adapters = adapter_ids(model)
    if rates.get(ADAPTERS) is not None and not adapters:
        raise PartLearningRateError(
            "lr_adapters is set, but the model has no LoRA adapter (no trainable parameter outside the "
            "parts): turn LoRA on (cfg.peft) or remove lr_adapters"
        )
    return adapters


def expected_lrs(
    config: OptimizerConfig, adapters: frozenset[int], resolved: Mapping[str, tuple[float, float]], param: Any
) -> tuple[str, tuple[float, float]] | None:
    """``(part, (max_lr, min_lr))`` a parameter must train with, or ``None`` when no per-part LR governs it."""
    part = lr_part(param, adapters)
    if part is None or part not in resolved or decoupled(config, param):
        return None
    return part, resolved[part]
