"""After the optimizer is built: every part with its own learning rate trains with exactly that LR, or an error.

A configured per-part LR that the optimizer never applied (the overrides were not passed, another override
replaced them, a checkpoint's parameter groups came back with other values...) is an error, not a log line.
Parameters are found by identity in megatron-core's optimizers, whose groups hold the model's parameters
(``FP32Optimizer``), their fp32 copies (``Float16OptimizerWithFloat16Params``: ``float16_groups`` /
``fp32_from_fp32_groups``) or shards of them (``DistributedOptimizer``: ``model_float16_groups`` /
``model_fp32_groups``), each list aligned with the inner optimizer's ``param_groups``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from bridge_freeze_plugin.errors import PartLearningRateError
from bridge_freeze_plugin.optim._overrides import adapter_ids, check_schedule, expected_lrs, lr_part, parameters
from bridge_freeze_plugin.optim._resume import keep_part_groups_on_load
from bridge_freeze_plugin.optim._settings import PartLearningRates

if TYPE_CHECKING:
    from megatron.core.optimizer import OptimizerConfig

logger = logging.getLogger("bridge_freeze_plugin")

#: (attribute of the model-side lists, ...) per megatron-core optimizer wrapper, aligned with its groups.
_MODEL_GROUP_ATTRS = (("model_float16_groups", "model_fp32_groups"), ("float16_groups", "fp32_from_fp32_groups"))


def held_groups(optimizer: Any) -> Iterator[tuple[dict, list[Any]]]:
    """``(param_group, model parameters it updates)`` for every group of a (chained) Megatron or torch optimizer."""
    for leaf in _leaves(optimizer):
        inner = getattr(leaf, "optimizer", leaf)
        if inner is None or not hasattr(inner, "param_groups"):  # a stub: nothing trains on this rank
            continue
        attrs = next((a for a in _MODEL_GROUP_ATTRS if all(hasattr(leaf, name) for name in a)), None)
        for index, group in enumerate(inner.param_groups):
            held = group["params"] if attrs is None else [p for a in attrs for p in getattr(leaf, a)[index]]
            yield group, list(held)


def _config_of(optimizer: Any) -> OptimizerConfig | None:
    config = getattr(optimizer, "config", None)
    if config is None:
        for sub in getattr(optimizer, "chained_optimizers", None) or ():
            config = getattr(sub, "config", None) or config
    return config


def verify_part_learning_rates(
    optimizer: Any,
    model: Any,
    rates: PartLearningRates,
    *,
    optimizer_config: OptimizerConfig | None = None,
    scheduler: Any = None,
) -> dict[str, tuple[float, float]]:
    """Check that each part with its own LR sits in parameter groups with exactly that ``max_lr`` / ``min_lr``.

    ``optimizer``: what ``get_megatron_optimizer`` returned (or a torch optimizer over the model's parameters);
    ``model``: its chunks; ``scheduler``: megatron-core's ``OptimizerParamScheduler``, when there is one (its
    warm-up is checked too). Returns part -> ``(max_lr, min_lr)`` as applied. Raises
    :class:`PartLearningRateError` naming the part, what was asked and what the optimizer holds.
    The optimizer's later ``load_state_dict`` (a resume) keeps each part's groups and is checked again
    (:func:`~bridge_freeze_plugin.optim._resume.keep_part_groups_on_load`).
    """
    config = optimizer_config if optimizer_config is not None else _config_of(optimizer)
    if config is None:
        raise PartLearningRateError("verify_part_learning_rates needs the optimizer config: pass optimizer_config=")
    resolved = rates.resolved(config.lr, config.min_lr)
    if scheduler is not None:
        check_schedule(rates, float(getattr(scheduler, "init_lr", 0.0)), int(getattr(scheduler, "lr_warmup_steps", 0)))
    _check_groups(optimizer, model, config, resolved)
    if resolved:
        built = _group_lrs(optimizer, config)
        keep_part_groups_on_load(optimizer, functools.partial(_check_loaded, optimizer, model, config, resolved, built))
        logger.info("bridge-freeze: per-part learning rates applied: %s", rates.describe())
    return resolved


def _check_groups(optimizer: Any, model: Any, config: OptimizerConfig,
                  resolved: dict[str, tuple[float, float]]) -> None:
    """Every parameter of a part with its own LR is in a group with exactly that LR."""
    adapters = adapter_ids(model)
    found: dict[str, int] = dict.fromkeys(resolved, 0)
    for group, held in held_groups(optimizer):
        for param in held:
            expected = expected_lrs(config, adapters, resolved, param)
            if expected is None:
                continue
            part, lrs = expected
            applied = (group.get("max_lr", config.lr), group.get("min_lr", config.min_lr))
            if applied != lrs:
                raise _not_applied(part, lrs, f"a parameter group with max_lr={applied[0]}, min_lr={applied[1]}")
            found[part] += 1
    _check_found(optimizer, model, config, adapters, resolved, found)


def _group_lrs(optimizer: Any, config: OptimizerConfig) -> list[tuple[float, float]]:
    """``(max_lr, min_lr)`` of every parameter group, in order."""
    return [(group.get("max_lr", config.lr), group.get("min_lr", config.min_lr)) for group, _ in held_groups(optimizer)]


def _check_loaded(optimizer: Any, model: Any, config: OptimizerConfig, resolved: dict[str, tuple[float, float]],
                  built: list[tuple[float, float]]) -> None:
    """After a checkpoint load: every group kept the LRs it was built with (a part at the global LR too), and each
    part with its own LR is in a group with exactly that LR."""
    adapters = adapter_ids(model)
    loaded = _group_lrs(optimizer, config)
    if len(loaded) != len(built):
        raise PartLearningRateError(
            f"a checkpoint load left the optimizer with {len(loaded)} parameter groups instead of the {len(built)} "
            f"it was built with: the per-part learning rates cannot be vouched for; load the checkpoint into an "
            f"optimizer built with the same per-part learning rates")
    for (_, held), lrs, now in zip(held_groups(optimizer), built, loaded, strict=True):
        if now != lrs:
            parts = sorted({lr_part(p, adapters) or "unclassified" for p in held})
            raise PartLearningRateError(
                f"a checkpoint load gave the parameter group of {', '.join(parts)} max_lr={now[0]}, min_lr={now[1]} "
                f"instead of max_lr={lrs[0]}, min_lr={lrs[1]}: the resumed run would train it at another part's "
                f"learning rate; load the checkpoint into an optimizer built with the same per-part learning rates")
    _check_groups(optimizer, model, config, resolved)


def _check_found(optimizer: Any, model: Any, config: OptimizerConfig, adapters: frozenset[int],
                 resolved: dict[str, tuple[float, float]], found: dict[str, int]) -> None:
    """A part that trains on this rank but is in no group: the optimizer was built without the overrides."""
    if any(hasattr(sub, "model_float16_groups") for sub in _leaves(optimizer)):
        return  # a distributed optimizer holds only this rank's shard: a small part may live on another rank
    for param in parameters(model):
        expected = expected_lrs(config, adapters, resolved, param) if param.requires_grad else None
        if expected is not None and not found[expected[0]]:
            raise _not_applied(expected[0], expected[1], "none of the optimizer's parameter groups")


def _leaves(optimizer: Any) -> Iterator[Any]:
    subs = getattr(optimizer, "chained_optimizers", None)
    if subs is None:
        yield optimizer
        return
    for sub in subs:
        yield from _leaves(sub)


def _not_applied(part: str, lrs: tuple[float, float], held: str) -> PartLearningRateError:
    return PartLearningRateError(
        f"lr_{part}={lrs[0]:g} (min {lrs[1]:g}) was asked, but the {part}'s parameters are in {held}: the "
        f"optimizer does not apply the per-part learning rate. Build it with the plugin's overrides "
        f"(cfg.optimizer_config_override_provider = PartLROverrideProvider(...) in Bridge, or "
        f"config_overrides=part_lr_overrides(...) for get_megatron_optimizer), and do not replace them"
    )
