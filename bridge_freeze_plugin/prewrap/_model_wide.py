"""The model-wide report under tensor, pipeline, expert and data parallelism.

Each rank holds a piece of the model: a tensor-parallel shard of its pipeline stage (or of its virtual
pipeline chunks), replicated over data-parallel ranks. :func:`model_wide_report` sums the per-part
counts over tensor-, pipeline- (and expert-) parallel ranks, never over data-parallel (or
context-parallel) replicas; a parameter duplicated over tensor-parallel ranks (``tensor_model_parallel``
false or absent: layer norms, biases of row-parallel layers, most HF vision towers) counts once; the copy
of a tied embedding / output weight that Megatron keeps on the last pipeline stage (marked ``shared``) is
not counted again. One ``all_reduce`` of a small tensor per report; every rank gets the same report.
With train / freeze patterns, the same ``all_reduce`` sums each pattern's matches: a pattern that matches
nothing in the whole model raises :class:`UnmatchedPatternError` on every rank (the same verdict everywhere).

Without an initialised process group (or with one process) the local report is the report.
torch and megatron-core are imported only when a function here runs.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from bridge_freeze_plugin.prewrap._classify import Classifier, named_parameters
from bridge_freeze_plugin.prewrap._counting import PartTally
from bridge_freeze_plugin.prewrap._report import FreezeReport
from bridge_freeze_plugin.prewrap._state import provider_state
from bridge_freeze_plugin.ranks import collective_device, world
from bridge_freeze_plugin.registry import REGISTRY
from bridge_freeze_plugin.request import PatternTally, check_matched

logger = logging.getLogger("bridge_freeze_plugin")


def _tp_rank(param: Any, parallel_state: Any) -> int:
    """This rank's index among the ranks that hold copies / shards of ``param`` along tensor parallel."""
    if not getattr(param, "allreduce", True):  # expert parameter: expert tensor parallel
        return int(parallel_state.get_expert_tensor_parallel_rank())
    return int(parallel_state.get_tensor_model_parallel_rank())


def ownership(param: Any, parallel_state: Any, replicas: bool = True) -> tuple[bool, bool]:
    """``(counts_here, first_shard)``: whether this rank counts ``param``'s elements in a model-wide sum over the
    world (one owner per element: data-parallel replica 0, tensor-parallel rank 0 for a duplicated tensor, never
    the last stage's copy of a tied embedding), and whether it holds the tensor's first shard (counts the tensor).
    ``replicas=False``: every data-parallel rank counts (each holds its own shard of something, a gradient)."""
    if getattr(param, "shared", False):  # last stage's copy of a tied embedding / output weight
        return False, False
    expert = not getattr(param, "allreduce", True)
    replica0 = not replicas or (parallel_state.get_expert_data_parallel_rank() if expert
                                else parallel_state.get_data_parallel_rank(with_context_parallel=True)) == 0
    first_tp = _tp_rank(param, parallel_state) == 0
    if not replica0 or not (getattr(param, "tensor_model_parallel", False) or first_tp):
        return False, False  # a data-parallel replica, or a copy duplicated over tensor-parallel ranks
    return True, first_tp


def _local_tally(model: Any, classifier: Classifier, parallel_state: Any, patterns: PatternTally | None) -> PartTally:
    """What this rank contributes to the model-wide counts (each parameter counted by one owner)."""
    tally = PartTally()
    for _, name, param in named_parameters(model):
        counts_here, first_tp = ownership(param, parallel_state)
        if not counts_here:
            continue
        # A sharded tensor is one tensor of the model: only its first shard counts as a tensor.
        trains, adapter = bool(param.requires_grad), not classifier.known(param)
        tally.add(classifier.part(name, param), int(param.numel()), trains, int(first_tp), adapter=trains and adapter)
        if patterns is not None and not adapter:  # model-wide name: what the freeze remembered
            patterns.add(classifier.bare_name(name, param), classifier.part(name, param), int(param.numel()),
                         int(first_tp))
    return tally


def model_wide_report(model: Any, local: FreezeReport, classifier: Classifier) -> FreezeReport:
    """The report of the whole model (all ranks' pieces, each counted once), from this rank's chunks.

    ``local`` gives the labels (provider, selection, overridden defaults); with no process group, or
    one process, it is returned unchanged. Every rank must call this at the same point.
    """
    dist = world()
    if dist is None:
        return local
    import torch
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        logger.debug("bridge-freeze: no Megatron model-parallel state; the report covers this rank only")
        return local
    selection = local.selection
    family = REGISTRY.get_or_none(local.family)
    listed = local.part_names if family is None else family.part_names()
    patterns = (PatternTally(selection.patterns, selection.frozen_parts(), listed)
                if selection.patterns else None)
    vector = _local_tally(model, classifier, parallel_state, patterns).as_vector()
    counts = torch.tensor(vector + (patterns.as_vector() if patterns else []), dtype=torch.int64,
                          device=collective_device())  # NCCL takes CUDA tensors only
    dist.all_reduce(counts)  # world group: the owners above make each parameter count once
    counts = counts.cpu()
    values = counts.tolist()
    report = dataclasses.replace(local, parts=PartTally.from_vector(values[: len(vector)]).parts(listed))
    if patterns is None:
        return report
    summary = patterns.load_vector(values[len(vector) :]).summary()
    names = (classifier.bare_name(n, p) for _, n, p in named_parameters(model) if classifier.known(p))
    check_matched(summary, f"{local.provider} (family {local.family})", names, gather=dist)
    return dataclasses.replace(report, patterns=summary)


def store_report(provider: Any, report: FreezeReport) -> None:
    provider_state(provider).report = report


def last_report(provider: Any) -> FreezeReport | None:
    """The report of the provider's last build: model-wide after ``provide_distributed_model()`` (the same
    on every rank), the built chunk's after a plain ``provide()``; ``None`` before any build."""
    report = provider_state(provider).report
    return report if isinstance(report, FreezeReport) else None
