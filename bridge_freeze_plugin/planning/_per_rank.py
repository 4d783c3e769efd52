"""What one GPU holds under a parallel layout: a real build of each distinct rank, on the meta device.

For a :class:`~bridge_freeze_plugin.planning._layout.Layout` with model parallelism, each pipeline stage (and,
when a train pattern or LoRA may tell experts apart, each expert-parallel rank of it) is built the way a
training job builds it: this process joins a ``world_size``-rank world of PyTorch's ``fake`` process-group
backend (every collective is a no-op, no peer exists) as a rank at that position, megatron-core's model-parallel
state is initialised for the layout, and the provider's real ``provide_distributed_model`` builds that rank's
model chunks (one per virtual-pipeline stage) on the meta device, the plugin's freeze (and LoRA) running as its
pre-wrap hook. Tensor-parallel ranks of a stage hold shards of equal size and data-parallel replicas are
identical, so one build answers for all of them (the gloo tests in tests/unit/planning/test_plan_per_rank.py compare
every rank of real 2-process builds).

The gradient buffer and the distributed optimizer's shards are megatron-core's own: each built rank is wrapped
in megatron-core's ``DistributedDataParallel`` (its buffers allocated on the meta device), whose padded
buffer sizes are the gradient buffer, and whose bucket layout the distributed optimizer shards over the data-
parallel ranks (the expert buffers over the expert-data-parallel ranks): a rank's optimizer state covers the
parameter elements inside its shard of each bucket; the largest data-parallel rank is reported.

Builds run with sequence parallelism off (megatron-core's local norms refuse it; it adds no parameter) after
the provider validated the layout with it on where megatron-core requires it (MoE with tensor parallelism).
The process's own single-rank gloo world is restored afterwards. The build of one rank (the fake world, the
provider set up for the layout, the gradient buffers) is :mod:`.rank_build`; see :mod:`.activations` for the
activation estimate each rank gets.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bridge_freeze_plugin.errors import BridgeFreezeError, PlanError
from bridge_freeze_plugin.planning._activations import (
    ActivationModel,
    StageLayers,
    in_flight_micro_batches,
    language_stack,
    micro_batch_bytes,
    vision_depth,
    vision_stack,
)
from bridge_freeze_plugin.planning._layout import Layout
from bridge_freeze_plugin.planning._rank_build import _Buffer, _configure, build_rank, representative_rank

logger = logging.getLogger("bridge_freeze_plugin")

#: ``<...>decoder.layers.<n>.`` of the language model (its layer index within the chunk).
_LM_LAYER = re.compile(r"(?:^|\.)language_model\.decoder\.layers\.(\d+)\.")


@dataclass(frozen=True)
class ActivationSettings:
    """What the activation estimate assumes (command-line ``--seq-length`` ...)."""

    seq_length: int = 4096
    micro_batch_size: int = 1
    #: patches the vision encoder sees per sample (before any spatial merge); ``None``: ``seq_length``
    vision_tokens: int | None = None
    #: ``none`` / ``selective`` / ``full``; ``None``: the provider's own ``recompute_granularity``
    recompute: str | None = None

    def __post_init__(self) -> None:
        for name in ("seq_length", "micro_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.vision_tokens is not None and (not isinstance(self.vision_tokens, int) or self.vision_tokens < 0):
            raise PlanError(f"--vision-tokens must be 0 or more, got {self.vision_tokens!r}")

    @property
    def patches(self) -> int:
        return self.seq_length if self.vision_tokens is None else self.vision_tokens


@dataclass(frozen=True)
class RankFigures:
    """One rank position's figures (``tp``, ``pp``, ``ep``: its tensor, pipeline and expert parallel ranks)."""

    tp: int
    pp: int
    ep: int
    parameters: int
    trainable: int
    weight_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    in_flight_micro_batches: float
    dense_layers: int
    moe_layers: int
    vision_layers: int

    @property
    def peak_activation_bytes(self) -> int:
        return round(self.activation_bytes * self.in_flight_micro_batches)

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes + self.peak_activation_bytes

    def as_dict(self) -> dict[str, Any]:
        return {
            "tp": self.tp, "pp": self.pp, "ep": self.ep,
            "parameters": self.parameters, "trainable": self.trainable,
            "weight_bytes": self.weight_bytes, "grad_bytes": self.grad_bytes,
            "optimizer_bytes": self.optimizer_bytes, "activation_bytes": self.activation_bytes,
            "in_flight_micro_batches": self.in_flight_micro_batches,
            "peak_activation_bytes": self.peak_activation_bytes, "total_bytes": self.total_bytes,
            "language_layers": {"dense": self.dense_layers, "moe": self.moe_layers},
            "vision_layers": self.vision_layers,
        }


# --- per-rank figures ------------------------------------------------------------------------------------


def _layers(chunks: list, family: Any) -> StageLayers:
    """The rank's language-model layers (dense / MoE) and whether it holds the vision encoder."""
    from bridge_freeze_plugin.planning._estimate import collect_params
    from bridge_freeze_plugin.request import Part

    layers: dict[tuple[int, str], bool] = {}
    has_vision = False
    for index, chunk in enumerate(chunks):
        for info in collect_params(chunk, family):
            found = _LM_LAYER.search(info.name)
            if found:
                key = (index, info.name[: found.end()])
                layers[key] = layers.get(key, False) or ".mlp.experts." in info.name or ".mlp.router." in info.name
            has_vision = has_vision or info.part is Part.VISION_MODEL
    moe = sum(layers.values())
    return StageLayers(dense_layers=len(layers) - moe, moe_layers=moe, vision_layers=int(has_vision))


def rank_figures(
    coords: dict[str, int],
    chunks: list,
    buffers: list[_Buffer],
    layout: Layout,
    assumptions: Any,
    activation_model: ActivationModel,
    settings: ActivationSettings,
    recompute: str,
    vision_layers: int,
    family: Any,
) -> RankFigures:
    """The figures of one built rank (``assumptions``: the plan's :class:`MemoryAssumptions`)."""
    seen: set[int] = set()
    total = trainable = 0
    for chunk in chunks:
        for param in chunk.parameters():
            if id(param) in seen:
                continue
            seen.add(id(param))
            total += param.numel()
            trainable += param.numel() if param.requires_grad else 0
    padded = sum(b.numel for b in buffers)
    if layout.use_distributed_optimizer:
        shard = sum(b.max_shard_elements() for b in buffers)
        optimizer = shard * assumptions.optimizer_bytes
    else:
        optimizer = trainable * assumptions.optimizer_bytes
    stage = _layers(chunks, family)
    stage = StageLayers(dense_layers=stage.dense_layers, moe_layers=stage.moe_layers,
                        vision_layers=vision_layers if stage.vision_layers else 0,
                        first_stage=coords["pp"] == 0, last_stage=coords["pp"] == layout.pp - 1)
    activation = micro_batch_bytes(
        activation_model, stage, seq_length=settings.seq_length, micro_batch_size=settings.micro_batch_size,
        vision_tokens=settings.patches, recompute=recompute, elem=assumptions.param_bytes,
    )
    return RankFigures(
        tp=coords["tp"], pp=coords["pp"], ep=coords["ep"],
        parameters=total, trainable=trainable,
        # trainable weights live in the (padded) parameter buffer megatron-core's DDP lays out
        weight_bytes=(total - trainable + padded if buffers else total) * assumptions.param_bytes,
        grad_bytes=padded * assumptions.grad_bytes,
        optimizer_bytes=optimizer,
        activation_bytes=activation,
        in_flight_micro_batches=in_flight_micro_batches(layout.pp, coords["pp"], layout.vp),
        dense_layers=stage.dense_layers, moe_layers=stage.moe_layers, vision_layers=stage.vision_layers,
    )


def activation_model(provider: Any, layout: Layout, family: Any, selection: Any, recompute: str) -> ActivationModel:
    """The sizes of ``provider``'s stacks; the plugin's full-recompute fix for the vision encoder when it applies."""
    from bridge_freeze_plugin.prewrap import affected_parts

    sp = layout.tp > 1
    lm = language_stack(provider, tp=layout.tp, sequence_parallel=sp)
    vision_config = getattr(provider, "vision_config", None)
    megatron_vision = vision_config is not None and hasattr(vision_config, "tensor_model_parallel_size")
    vision = vision_stack(vision_config, tp=layout.tp if megatron_vision else 1, sequence_parallel=False)
    off = recompute == "full" and bool(affected_parts(family, selection))
    vocab = int(getattr(provider, "vocab_size", 0) or 0)
    return ActivationModel(language=lm, vocab=vocab, vision=vision, vision_recompute_off=off)


def plan_ranks(
    make_provider: Callable[[], Any],
    layout: Layout,
    *,
    family: Any,
    selection: Any,
    assumptions: Any,
    settings: ActivationSettings,
    build_context: Callable[[], Any],
    prepare: Callable[[Any], None],
    distinct_experts: bool,
) -> tuple[list[RankFigures], str]:
    """Every rank position's figures for ``layout``; the recompute setting the estimate used.

    ``make_provider`` gives a fresh (not yet finalized for this layout) provider per build; ``prepare`` makes it
    freezable and registers any LoRA hook; ``distinct_experts``: build each expert-parallel rank (a train
    pattern or LoRA may tell experts apart), else expert rank 0 answers for all.
    """
    built: dict[tuple[int, int], RankFigures] = {}
    recompute_used = "none"
    for pp_rank in range(layout.pp):
        for ep_rank in (range(layout.ep) if distinct_experts else [0]):
            provider = make_provider()
            _configure(provider, layout)
            recompute_used = settings.recompute or (getattr(provider, "recompute_granularity", None) or "none")
            prepare(provider)
            rank = representative_rank(layout, pp_rank, ep_rank)
            try:
                coords, (chunks, buffers) = build_rank(provider, layout, rank, build_context)
            except BridgeFreezeError:
                raise
            except Exception as exc:
                from bridge_freeze_plugin.planning._model_choice import error_line

                cause = exc
                while cause.__context__ is not None and "meta tensor" in str(cause):
                    cause = cause.__context__  # the build's own error, not the collective that reported it
                raise PlanError(f"building rank {rank} of {layout.describe()} on the meta device failed: "
                                f"{error_line(cause)}") from exc
            model = activation_model(provider, layout, family, selection, recompute_used)
            depth = vision_depth(getattr(provider, "vision_config", None))
            built[(coords["pp"], coords["ep"])] = rank_figures(
                coords, chunks, buffers, layout, assumptions, model, settings, recompute_used, depth, family)
    figures = []
    for pp_rank in range(layout.pp):
        for ep_rank in range(layout.ep):
            base = built.get((pp_rank, ep_rank if distinct_experts else 0))
            if base is None:  # expert rank 0 answers for the others
                base = next(f for (p, _), f in built.items() if p == pp_rank)
            for tp_rank in range(layout.tp):
                figures.append(RankFigures(**{**base.__dict__, "tp": tp_rank, "pp": pp_rank, "ep": ep_rank}))
    return figures, recompute_used
