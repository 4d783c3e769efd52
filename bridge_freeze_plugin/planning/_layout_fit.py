"""Whether a parallel layout fits the model's own counts, checked before megatron-core builds a rank.

megatron-core checks some of a layout against the model when the provider is finalized, and names them (tensor
parallel against attention heads and query groups). The rest it asserts while it builds a layer, with a bare
``AssertionError`` (expert parallel against the experts, expert-tensor parallel against an expert's FFN size,
pipeline against the layers, virtual pipeline against a stage's layers), or not at all (an uneven pipeline's
first / last stage given more layers than the model has). Each is checked here from the provider's fields, and
refused with a :class:`~bridge_freeze_plugin.errors.PlanError` naming the option and its value, the model's count
(and its field), and the values that fit. Context parallelism is not an option of ``plan`` (it is 1).
"""

from __future__ import annotations

from typing import Any

from bridge_freeze_plugin.errors import PlanError
from bridge_freeze_plugin.planning._layout import _FLAGS, Layout

#: Divisors listed as "valid choices" at most (the smallest first).
_MAX_CHOICES = 16


def _divisors(n: int) -> str:
    found = [d for d in range(1, n + 1) if n % d == 0] if n <= 1 << 16 else \
        sorted({d for i in range(1, int(n ** 0.5) + 1) if n % i == 0 for d in (i, n // i)})
    more = ", ..." if len(found) > _MAX_CHOICES else ""
    return ", ".join(str(d) for d in found[:_MAX_CHOICES]) + more


def _int_field(provider: Any, name: str) -> int | None:
    value = getattr(provider, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _check_experts(provider: Any, layout: Layout) -> None:
    experts = _int_field(provider, "num_moe_experts")
    if experts is None:
        if layout.ep > 1:
            raise PlanError(f"{_FLAGS['ep']} {layout.ep}: this model has no routed experts (num_moe_experts is "
                            f"unset), so there is nothing to split over expert-parallel ranks: leave "
                            f"{_FLAGS['ep']} at 1")
        return
    if experts % layout.ep:
        raise PlanError(
            f"{_FLAGS['ep']} {layout.ep} does not divide this model's {experts} experts per layer "
            f"(num_moe_experts): megatron-core gives each expert-parallel rank the same number of experts; "
            f"valid choices: {_divisors(experts)}")
    ffn = _int_field(provider, "moe_ffn_hidden_size") or _int_field(provider, "ffn_hidden_size")
    if ffn is not None and ffn % layout.expert_tp:
        given = (f"{_FLAGS['etp']} {layout.etp}" if layout.etp is not None
                 else f"{_FLAGS['etp']} (by default {_FLAGS['tp']}) {layout.expert_tp}")
        raise PlanError(
            f"{given} does not divide this model's expert FFN size {ffn} (moe_ffn_hidden_size): megatron-core "
            f"splits each expert's FFN evenly over the expert-tensor-parallel ranks; valid choices: "
            f"{_divisors(ffn)}")


def _check_even_pipeline(layers: int, layout: Layout) -> None:
    if layers % layout.pp:
        raise PlanError(
            f"{_FLAGS['pp']} {layout.pp} does not divide this model's {layers} language-model layers "
            f"(num_layers): each pipeline stage holds the same number; valid choices: {_divisors(layers)}, or "
            f"give the first / last stage their own count with {_FLAGS['first_stage_layers']} / "
            f"{_FLAGS['last_stage_layers']}")
    per_stage = layers // layout.pp
    if layout.vp is not None and per_stage % layout.vp:
        raise PlanError(
            f"{_FLAGS['vp']} {layout.vp} does not divide the {per_stage} language-model layers of each pipeline "
            f"stage ({layers} layers / {_FLAGS['pp']} {layout.pp}): each virtual stage holds the same number; "
            f"valid choices: {_divisors(per_stage)}")


def _check_uneven_pipeline(layers: int, layout: Layout) -> None:
    given = {name: getattr(layout, name) for name in ("first_stage_layers", "last_stage_layers")
             if getattr(layout, name) is not None}
    spelled = " + ".join(f"{_FLAGS[name]} {value}" for name, value in given.items())
    middle, stages = layers - sum(given.values()), layout.pp - len(given)
    if middle < 0 or stages < 0 or bool(middle) != bool(stages):
        raise PlanError(
            f"{spelled} with {_FLAGS['pp']} {layout.pp} does not fit this model's {layers} language-model layers "
            f"(num_layers): {max(middle, 0)} layers would be left for {max(stages, 0)} middle stage(s); give "
            f"counts that sum with the middle stages' to {layers}")
    if stages and middle % stages:
        raise PlanError(
            f"{spelled} leaves {middle} language-model layers for {stages} middle pipeline stage(s) "
            f"({_FLAGS['pp']} {layout.pp}): each middle stage holds the same number; change the first / last "
            f"counts so that the rest divides by {stages}")
    if layout.vp is not None:
        for name, count in [*given.items(), ("middle stage", middle // stages if stages else 0)]:
            if count and count % layout.vp:
                where = _FLAGS.get(name, "each middle stage")
                raise PlanError(
                    f"{_FLAGS['vp']} {layout.vp} does not divide the {count} language-model layers of {where}: "
                    f"each virtual stage holds the same number; valid choices: {_divisors(count)}")


def check_layout_fits(provider: Any, layout: Layout) -> None:
    """Refuse ``layout`` where the model's counts do not take it (module docstring); before ``finalize``."""
    _check_experts(provider, layout)
    layers = _int_field(provider, "num_layers")
    if layers is None:
        return
    layers += sum(bool(getattr(provider, name, False)) for name in (
        "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"))
    if layout.first_stage_layers is None and layout.last_stage_layers is None:
        _check_even_pipeline(layers, layout)
    else:
        _check_uneven_pipeline(layers, layout)
