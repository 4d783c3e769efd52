"""The parts of sizing a weight sync (:mod:`.sync_bytes`) that work around the plan's CPU meta build and spare
Bridge's repeated work: conversion tasks for routed experts held as ``SequentialMLP``, the parameters no task
exports, one process-group lookup per model, and fused expert tensors sized without running their tasks.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterable, Iterator
from typing import Any

from bridge_freeze_plugin.errors import PlanError

logger = logging.getLogger("bridge_freeze_plugin.planning._sync_bytes")


def left_out(model_bridge: Any, chunks: list[Any], tasks: list[Any]) -> dict[str, int]:
    """``name -> elements`` of the model's parameters that no conversion task exports (single chunk; else empty).

    A routed expert of the CPU build (``SequentialMLP``) counts as exported under its grouped-GEMM name too
    (:func:`sequential_expert_tasks`); LoRA adapters are merged into their bases, not exported themselves."""
    if len(chunks) != 1:
        return {}
    # a task without a tensor is Bridge's placeholder for a name it left out (its HF tensor is not in the layout)
    covered = {task.param_name for task in tasks if task.param_weight is not None}
    left: dict[str, int] = {}
    for name, param in chunks[0].named_parameters():
        if model_bridge._is_adapter_param_name(name):
            continue
        plain = model_bridge._unwrap_name(name)
        found = _SEQUENTIAL_EXPERT.match(plain)
        names = {name, plain, model_bridge._get_lora_unwrapped_name(plain)}
        if found is not None:
            names.add(f"{found['experts']}.{found['linear']}.{found['kind']}{found['n']}")
        if not names & covered:
            left[name] = int(param.numel())
    return left


#: A routed expert's tensor as megatron-core's ``SequentialMLP`` names it (the CPU meta build's experts).
_SEQUENTIAL_EXPERT = re.compile(r"^(?P<experts>.+\.mlp\.experts)\.local_experts\.(?P<n>\d+)\."
                                r"(?P<linear>linear_fc[12])\.(?P<kind>weight|bias)$")


def sequential_expert_tasks(model_bridge: Any, chunks: list[Any], tasks: list[Any], weight_dtype: Any) -> list[Any]:
    """Conversion tasks for routed experts that Bridge maps only under their grouped-GEMM names.

    The plan's meta build has no TransformerEngine, so megatron-core builds routed experts as ``SequentialMLP``
    (``experts.local_experts.<n>.linear_fc1.weight``). A GPU build with grouped GEMM holds the same tensors, of
    the same shapes, as ``TEGroupedMLP`` (``experts.linear_fc1.weight<n>``), and some of Bridge's bridges
    (GLM-4.5V, Gemma4-VL, MiniMax-M3) map only those names: the export would leave every routed expert out.
    Each such tensor that no task covers gets a task under its grouped name, with the mapping Bridge's registry
    gives that name (Bridge reads the expert number from it), so the sizes are those of the export a GPU build
    makes. Single chunk, single rank (the plan's whole-model build).
    """
    if len(chunks) != 1:
        return []
    from megatron.bridge.models.conversion.model_bridge import WeightConversionTask

    from bridge_freeze_plugin.export import call_accepted

    covered = {task.param_name for task in tasks}
    registry = None
    added = []
    for name, param in chunks[0].named_parameters():
        found = _SEQUENTIAL_EXPERT.match(name)
        if found is None or name in covered:
            continue
        if registry is None:
            registry = model_bridge.mapping_registry()
            language_model = getattr(chunks[0], "language_model", chunks[0])
            registry.set_process_groups_from_pg_collection(getattr(language_model, "pg_collection", None))
        grouped = f"{found['experts']}.{found['linear']}.{found['kind']}{found['n']}"
        mapping = registry.megatron_to_hf_lookup(grouped)
        if mapping is None:
            continue
        module = chunks[0].get_submodule(f"{found['experts']}.local_experts.{found['n']}.{found['linear']}")
        added.append(call_accepted(WeightConversionTask, param_name=grouped, global_param_name=grouped,
                                   mapping=mapping, pp_rank=0, vp_stage=0, megatron_module=module,
                                   param_weight=param, weight_dtype=weight_dtype))
    if added:
        logger.debug("weight sync: %d routed-expert tensors sized under their grouped-GEMM names", len(added))
    return added


@contextlib.contextmanager
def pg_collection_once() -> Iterator[None]:
    """Bridge asks, per parameter and per task, which process-group collection the model carries
    (``model_bridge._get_pg_collection_from_model``: an unwrap of the model each time, about 250,000 times and
    2 s of a 235B sizing). The answer cannot change while the sizing runs: each model's is looked up once."""
    from megatron.bridge.models.conversion import model_bridge as module

    original = getattr(module, "_get_pg_collection_from_model", None)
    if original is None:  # another Bridge version: nothing to spare
        yield
        return
    answers: dict[int, tuple[Any, Any]] = {}

    def once(megatron_model: Any) -> Any:
        first = megatron_model[0] if isinstance(megatron_model, list) and megatron_model else megatron_model
        held = answers.get(id(first))
        if held is None or held[0] is not first:
            held = (first, original(megatron_model))
            answers[id(first)] = held
        return held[1]

    module._get_pg_collection_from_model = once
    try:
        yield
    finally:
        module._get_pg_collection_from_model = original


def export_size(bridge: Any, chunks: list[Any], tasks: list[Any], listing: dict[str, Any] | None,
                 weight_dtype: Any, options: dict[str, Any]) -> tuple[int, int]:
    """Bytes and number of the HF tensors Bridge's export of ``tasks`` yields.

    Routed experts stored fused in the checkpoint (Bridge's grouped export: one HF tensor per layer and
    projection, stacked from one task per expert) are sized without running their tasks: the stacked tensor
    is the group's per-expert tensors, so it has the sum of their elements, which must also be the element
    count of the listing's tensor of that name (Bridge reshapes the stack to it); the sync dtype applies.
    Any group that does not meet both goes through the export with the other tasks. On a 235B-A22B model
    this spares running 24,000 of its 25,000 tasks (about 2.5 s of CPU).
    """
    by_group: dict[str, list[Any]] = {}
    if listing is not None:
        for task in tasks:
            if getattr(task.mapping, "is_grouped_export", False) and task.param_weight is not None:
                by_group.setdefault(str(task.mapping.group_key), []).append(task)
    elements, sized, skipped = 0, 0, set()
    for key, members in by_group.items():
        total = sum(int(task.param_weight.numel()) for task in members)
        held = listing.get(key) if listing is not None else None
        if held is not None and int(held.numel()) == total and all(t.param_weight.is_floating_point()
                                                                    for t in members):
            elements += total
            sized += 1
            skipped.update(id(task) for task in members)
    remaining = [task for task in tasks if id(task) not in skipped]
    if sized:
        logger.debug("weight sync: %d fused expert tensors sized from their %d tasks", sized, len(skipped))
    exported_bytes, exported = _size(bridge.export_hf_weights(chunks, conversion_tasks=remaining, **options),
                                     weight_dtype)
    return exported_bytes + elements * weight_dtype.itemsize, exported + sized


def _size(stream: Iterable[tuple[str, Any]], weight_dtype: Any) -> tuple[int, int]:
    """Bytes and number of the tensors a (meta) export stream yields; checks each HF name comes once.
    A floating-point tensor counts in the sync dtype, as Bridge's cast sends it (a Bridge whose tasks take no
    ``weight_dtype`` yields the meta build's dtype: the figure is the same on every Bridge)."""
    total, names = 0, set()
    for name, tensor in stream:
        if name in names:
            raise PlanError(f"Megatron-Bridge's export yields HF tensor {name} twice; cannot size the weight sync")
        names.add(name)
        size = weight_dtype.itemsize if tensor.is_floating_point() else tensor.element_size()
        total += tensor.numel() * size
    return total, len(names)
