"""RL weight sync of only what trains: Bridge's HF export limited to the HF tensors that can have changed.

After each RL step the policy's weights go to the inference engine through
``AutoBridge.export_hf_weights(model)``, which yields every HF tensor. With a frozen language model or vision
tower most of them cannot have changed since the engine loaded them. :func:`export_trainable_hf_weights` yields
the same ``(name, tensor)`` stream -- same HF names, dtypes, values and order, produced by Bridge's own export
with Bridge's own collectives -- limited to the HF tensors that depend on at least one Megatron parameter that
trains.

How (nothing of Bridge's conversion is re-implemented here):

1. Bridge's conversion tasks are built as its export builds them (``build_conversion_tasks``; one task per
   Megatron parameter or persistent buffer, the same list, in the same order, on every rank: positions match
   across tensor-, pipeline- and expert-parallel ranks, which is what Bridge's own collectives rely on).
2. Each rank marks the tasks whose Megatron tensor it holds and that can change during training: the parameter
   has ``requires_grad`` (full-rank parts, train patterns); with adapter merging on, a LoRA-wrapped base
   (``...to_wrap.weight``) whose adapters (the ones Bridge's export merges into it,
   ``build_adapter_conversion_tasks``) have ``requires_grad``; a MoE router's ``expert_bias`` buffer that
   megatron-core updates without gradients (``moe_router_enable_expert_bias``, a non-zero
   ``moe_router_bias_update_rate``, and not ``frozen_expert_bias``);
   the running statistics (``running_mean`` / ``running_var`` / ``num_batches_tracked``, persistent buffers Bridge
   maps) of a BatchNorm-like module that a forward in train mode updates: one whose part trains (a frozen part's
   run in eval mode and cannot move: ``prewrap``'s running-statistics rule).
3. The marks are made model-wide by an ``all_reduce`` (MAX) over the ranks that export together, so a task
   held by another pipeline stage or expert-parallel rank is decided the same way everywhere.
4. Tasks that feed one HF tensor together are kept together: tasks are linked when their mappings name a common
   HF tensor (fused expert groups, concatenated biases, anything Bridge assembles from several tasks); a group
   with one marked task is kept whole. Repeated with an ``all_reduce`` until no rank adds a task.
5. Bridge's ``export_hf_weights`` runs with the kept tasks (``conversion_tasks=``): it gathers, merges adapters
   and converts them exactly as in a full export, on every rank.

A task that yields several HF tensors (QKV -> q/k/v, gate/up) is one task: all of them are sent when it trains.

The first sync of a run sends everything (``everything=True``): see ``docs/rl-weight-sync.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from bridge_freeze_plugin.errors import TrainableSyncError
from bridge_freeze_plugin.export._coverage import untasked_message, untasked_trainable
from bridge_freeze_plugin.export._signature import accepts, bridge_version, call_accepted
from bridge_freeze_plugin.prewrap import expert_bias_moves, stats_move
from bridge_freeze_plugin.ranks import collective_device

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

__all__ = ["TrainableSyncError", "export_trainable_hf_weights", "trainable_conversion_tasks"]

#: How many rounds of "keep a whole group, agree across ranks" may run before giving up (each round adds tasks).
_MAX_ROUNDS = 16


def export_trainable_hf_weights(
    bridge: Any,
    model: Any,
    cpu: bool = True,
    *,
    everything: bool = False,
    group: Any = None,
    **kwargs: Any,
) -> Iterable[tuple[str, torch.Tensor]]:
    """``bridge.export_hf_weights(model, cpu=cpu, **kwargs)`` limited to the HF tensors that can have changed.

    ``bridge`` is the ``AutoBridge`` the model was built from, ``model`` the Megatron model (a chunk or the list
    of chunks, wrapped or not). Yields Bridge's ``HFWeightTuple`` ``(name, tensor)`` pairs: the HF tensors that
    depend on at least one Megatron parameter that trains (``requires_grad``), including LoRA-wrapped bases
    whose adapters train (merged by Bridge's export, unless ``merge_adapter_weights=False``), in the order of a
    full export. ``everything=True`` returns Bridge's full export unchanged (the first sync of a run).

    Every rank that takes part in Bridge's export must call this at the same point: it runs collectives
    (``all_reduce`` over ``group``, the world by default; pass the group of the ranks that export together when
    only some do). The tasks are decided when this function is called, before the first tensor is yielded.

    ``kwargs`` are ``export_hf_weights``'s: ``show_progress``, ``merge_adapter_weights``, ``weight_dtype``,
    ``conversion_tasks`` (pre-built tasks are filtered the same way).
    """
    if everything:
        return bridge.export_hf_weights(model, cpu=cpu, **kwargs)
    weight_dtype = kwargs.pop("weight_dtype", None)
    tasks = kwargs.pop("conversion_tasks", None)
    if weight_dtype is not None and tasks is not None:
        raise TrainableSyncError(
            f"export_trainable_hf_weights(weight_dtype={weight_dtype}, conversion_tasks=[...]) on "
            f"{_describe(bridge)}: Bridge records weight_dtype when it builds the tasks; pass one or the other"
        )
    kept = trainable_conversion_tasks(
        bridge,
        model,
        merge_adapter_weights=kwargs.get("merge_adapter_weights", True),
        weight_dtype=weight_dtype,
        conversion_tasks=tasks,
        group=group,
    )
    return bridge.export_hf_weights(model, cpu=cpu, conversion_tasks=kept, **kwargs)


def trainable_conversion_tasks(
    bridge: Any,
    model: Any,
    *,
    merge_adapter_weights: bool = True,
    weight_dtype: torch.dtype | None = None,
    conversion_tasks: Sequence[Any] | None = None,
    group: Any = None,
    require_every_trainable: bool = True,
) -> list[Any]:
    """Bridge's conversion tasks for ``model`` that produce an HF tensor that can have changed (collective).

    The same list on the same positions on every rank of ``group``; pass it to ``bridge.export_hf_weights(model,
    conversion_tasks=...)``. ``conversion_tasks``: tasks built beforehand (``bridge.get_conversion_tasks``) to
    filter instead of building them here.

    A parameter that trains but that no task exports (Bridge has no mapping for it: another model's bridge, a
    module Bridge's export does not know) raises :class:`TrainableSyncError` on every rank, naming it: its
    training would never reach the inference engine. ``require_every_trainable=False`` skips that check (for a
    caller that reports such parameters itself: ``bridge-freeze plan``'s sizing).
    """
    if getattr(bridge, "export_weight_dtype", None) == "fp8":
        raise TrainableSyncError(
            f"a trainable-only export of {_describe(bridge)} with export_weight_dtype='fp8': Bridge's FP8 export "
            "pairs each weight with scale tensors built as separate tasks, which this filter does not link; "
            "send everything (export_trainable_hf_weights(..., everything=True)) or export in bf16"
        )
    from megatron.bridge.models.conversion.utils import unwrap_model

    chunks = unwrap_model(model if isinstance(model, list) else [model])
    model_bridge = bridge._model_bridge  # a fresh MegatronModelBridge, as export_hf_weights uses
    tasks = _all_tasks(bridge, chunks, weight_dtype) if conversion_tasks is None else list(conversion_tasks)
    adapter_tasks = model_bridge.build_adapter_conversion_tasks(chunks) if merge_adapter_weights else {}

    untasked = untasked_trainable(model_bridge, chunks, tasks, adapter_tasks) if require_every_trainable else []
    dist, device = _collective(group)
    anywhere = _agree_on_length(dist, device, group, len(tasks), bridge, len(untasked))
    if anywhere:  # on every rank, so that none waits in a collective for a rank that raised
        raise TrainableSyncError(untasked_message(_describe(bridge), chunks, untasked, anywhere))
    marks = [_changes(task, adapter_tasks, merge_adapter_weights) for task in tasks]
    marks = _closed_over_links(bridge, tasks, _any_rank(dist, device, group, marks), dist, device, group)
    kept = [task for task, keep in zip(tasks, marks, strict=True) if keep and task is not None]
    logger.debug(
        "trainable sync of %s: %d of %d conversion tasks", _describe(bridge), len(kept),
        sum(task is not None for task in tasks),
    )
    return kept



def _all_tasks(bridge: Any, chunks: list[Any], weight_dtype: Any) -> list[Any]:
    """Bridge's conversion tasks of ``chunks``, cast to ``weight_dtype`` where the installed Bridge can."""
    model_bridge = bridge._model_bridge
    if weight_dtype is not None and not accepts(model_bridge.build_conversion_tasks, "weight_dtype"):
        raise TrainableSyncError(
            f"a trainable-only export of {_describe(bridge)} with weight_dtype={weight_dtype}: this "
            f"Megatron-Bridge ({bridge_version()[0]}) cannot cast its export (its build_conversion_tasks takes no "
            "weight_dtype); leave weight_dtype out (each tensor is sent in the dtype the model holds it in) "
            "and cast what you receive, or use a Bridge of 0.6.2 or newer"
        )
    return list(call_accepted(model_bridge.build_conversion_tasks, bridge.hf_pretrained, chunks,
                              weight_dtype=weight_dtype))


def _closed_over_links(bridge: Any, tasks: list[Any], marks: list[bool], dist: Any, device: Any,
                       group: Any) -> list[bool]:
    """``marks`` widened to every task linked to a marked one (tasks that export one HF tensor together), agreed
    between the ranks of ``group`` until no rank adds one."""
    links = _linked_tasks(tasks)
    for _ in range(_MAX_ROUNDS):
        # links[i] is one shared set per group: decide each group once (a 235B MoE: 25,000 tasks in groups of 128)
        group_marked: dict[int, bool] = {}
        for members in links:
            if id(members) not in group_marked:
                group_marked[id(members)] = any(marks[j] for j in members)
        closed = [marks[i] or group_marked[id(links[i])] for i in range(len(tasks))]
        closed = _any_rank(dist, device, group, closed)
        if closed == marks:
            return marks
        marks = closed
    raise TrainableSyncError(
        f"the trainable tasks of {_describe(bridge)} did not settle in {_MAX_ROUNDS} rounds of agreement "
        "between ranks; send everything (everything=True) and report this model"
    )


def _describe(bridge: Any) -> str:
    name = getattr(getattr(bridge, "hf_pretrained", None), "model_name_or_path", None)
    return f"{type(bridge).__name__}({name})" if name else type(bridge).__name__


def _collective(group: Any) -> tuple[Any, Any]:
    """``torch.distributed`` and the device its ``all_reduce`` takes over ``group``, or ``(None, None)``."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return None, None
    return dist, collective_device(group)


def _agree_on_length(dist: Any, device: Any, group: Any, length: int, bridge: Any, untasked: int = 0) -> int:
    """Every rank must hold as many tasks (positions are what ranks agree on); raise on every rank if not.

    Returns the most trainable parameters without a task that one rank holds (``untasked`` on this rank)."""
    if dist is None:
        return untasked
    import torch

    bounds = torch.tensor([length, -length, untasked], dtype=torch.int64, device=device)
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX, group=group)
    longest, shortest = int(bounds[0]), -int(bounds[1])
    if longest != shortest:
        raise TrainableSyncError(
            f"a trainable-only export of {_describe(bridge)}: ranks hold between {shortest} and {longest} "
            f"conversion tasks (this rank {length}), so they cannot agree task by task; call it on every rank "
            "of the export with the same model, or pass group= with the ranks that export together"
        )
    return int(bounds[2])


def _any_rank(dist: Any, device: Any, group: Any, marks: list[bool]) -> list[bool]:
    if dist is None or not marks:
        return marks
    import torch

    flags = torch.tensor(marks, dtype=torch.uint8, device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
    return [bool(flag) for flag in flags.tolist()]


def _changes(task: Any, adapter_tasks: dict[str, list[Any]], merge: bool) -> bool:
    """Whether this rank holds the task's Megatron tensor and training can change it."""
    if task is None or task.param_weight is None:
        return False
    weight = task.param_weight
    if getattr(weight, "requires_grad", False):
        return True
    if merge and ".to_wrap.weight" in task.global_param_name:
        prefix = task.global_param_name.partition(".to_wrap.weight")[0]
        for adapter in adapter_tasks.get(prefix, ()):
            for side in (adapter.linear_in_task, adapter.linear_out_task):
                if getattr(side.param_weight, "requires_grad", False):
                    return True
    return _updated_expert_bias(task) or _moving_statistics(task)


def _moving_statistics(task: Any) -> bool:
    """A running-statistics buffer of a module whose forward updates it (no gradient): its part trains."""
    module = task.megatron_module
    if module is None or not stats_move(module):
        return False
    return any(buffer is task.param_weight for buffer in module.buffers(recurse=False))


def _updated_expert_bias(task: Any) -> bool:
    """A router's ``expert_bias`` buffer: megatron-core's ``finalize_model_grads`` updates it without gradients."""
    module = task.megatron_module
    if module is None or getattr(module, "expert_bias", None) is not task.param_weight:
        return False
    return expert_bias_moves(getattr(module, "config", None)) and not getattr(module, "frozen_expert_bias", False)


def _hf_names(task: Any) -> set[str]:
    """The HF tensor names a task's mapping writes (its grouped-export key included)."""
    mapping = task.mapping
    names: set[str] = set()
    hf_param = getattr(mapping, "hf_param", None)
    if isinstance(hf_param, str):
        names.add(hf_param)
    elif isinstance(hf_param, dict):
        names.update(str(value) for value in hf_param.values())
    group_key = getattr(mapping, "group_key", None) if getattr(mapping, "is_grouped_export", False) else None
    if group_key is not None:
        names.add(str(group_key))
    return names


def _linked_tasks(tasks: Sequence[Any]) -> list[set[int]]:
    """For each task position, the positions of the tasks that share an HF tensor name with it (transitively);
    the positions of one group share one set object."""
    parent = list(range(len(tasks)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, task in enumerate(tasks):
        if task is None:
            continue
        for name in _hf_names(task):
            if name in owner:
                parent[root(i)] = root(owner[name])
            else:
                owner[name] = i
    members: dict[int, set[int]] = {}
    for i in range(len(tasks)):
        members.setdefault(root(i), set()).add(i)
    return [members[root(i)] for i in range(len(tasks))]
