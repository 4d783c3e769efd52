"""Every parameter that trains must leave with the weight sync: the ones no conversion task exports, named.

Bridge builds one conversion task per Megatron tensor its mapping registry knows; a tensor it has no mapping
for is left out with a log line (``No mapping found``). Given another model's bridge, every tensor is such a
tensor, and a trainable-only sync would send nothing, step after step. :func:`untasked_trainable` finds the
trainable parameters of this rank that no task exports, so that :func:`~._sync.trainable_conversion_tasks`
refuses the sync instead (:class:`~bridge_freeze_plugin.errors.TrainableSyncError`), naming them.

What counts as exported, as Bridge's export does it:

- a parameter with a task of its own (by identity: a task holds the module's tensor itself);
- a LoRA adapter (``.adapter.`` in its name) when the export merges adapters and the base it is merged into has
  a task; without merging Bridge's HF export leaves adapters out by design (its adapter exports carry them);
- a tied output layer (``share_embeddings_and_output_weights``): Bridge exports the embedding it is tied to.

A plain ``torch.nn.Linear`` that LoRA replaced with a bare ``LinearAdapter`` copy (Bridge up to 0.6.2, an
HF-implemented tower) has ``linear_in`` / ``linear_out`` weights that no task exports and no merge carries: they
are named here too. Where LoRA kept the layer as ``to_wrap`` (0.7.0), its base has a task and the adapters merge.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bridge_freeze_plugin.errors import some_of

_SHOWN = 12


def untasked_trainable(
    model_bridge: Any, chunks: Sequence[Any], tasks: Sequence[Any], adapter_tasks: dict[str, list[Any]]
) -> list[str]:
    """The names (``chunk i: name`` with several chunks) of this rank's trainable parameters no task exports."""
    covered = {id(task.param_weight) for task in tasks if task is not None and task.param_weight is not None}
    merged_bases = {
        task.global_param_name.partition(".to_wrap.weight")[0]
        for task in tasks
        if task is not None and ".to_wrap.weight" in task.global_param_name
    }
    for prefix, adapters in adapter_tasks.items():
        if prefix in merged_bases:
            for adapter in adapters:
                covered.update(id(side.param_weight) for side in (adapter.linear_in_task, adapter.linear_out_task))
    merging = bool(adapter_tasks)
    found: list[str] = []
    for index, chunk in enumerate(chunks):
        tied = bool(getattr(getattr(chunk, "config", None), "share_embeddings_and_output_weights", False))
        for name, param in chunk.named_parameters():
            if not param.requires_grad or id(param) in covered:
                continue
            if tied and "output_layer" in name:
                continue
            if model_bridge._is_adapter_param_name(name) and not merging:
                continue  # Bridge's HF export without merging leaves adapters out, as asked
            found.append(f"chunk {index}: {name}" if len(chunks) > 1 else name)
    return found


def untasked_message(bridge: str, chunks: Sequence[Any], untasked: list[str], anywhere: int) -> str:
    """The error of a sync that would leave trainable parameters behind (``anywhere``: the most on one rank)."""
    model = type(chunks[0]).__name__ if chunks else "the model"
    if untasked:
        shown = some_of(untasked, _SHOWN)
        what = f"{len(untasked)} trainable parameter(s) of {model} have no conversion task, so no HF tensor: {shown}"
    else:
        what = f"another rank holds {anywhere} trainable parameter(s) of {model} that no conversion task exports"
    return (
        f"a trainable-only weight sync of {model} with {bridge}: {what}. Their training would never reach the "
        "inference engine. Pass the AutoBridge the model was built from (AutoBridge.from_hf_pretrained of the "
        "same checkpoint; another model's bridge maps none of its tensors). A LoRA adapter on a plain "
        "torch.nn.Linear made a bare LinearAdapter copy (no to_wrap, in an HF-implemented tower) is carried by no "
        "Bridge export: target Megatron linear layers, or train that part at full rank."
    )
