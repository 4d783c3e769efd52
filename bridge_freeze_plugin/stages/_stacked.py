"""A trainable-only save cannot hold part of a stacked tensor: refused before the run trains.

megatron-core's ``sharded_state_dict`` saves the entries of some module lists as ONE tensor with a leading axis (a
``TransformerBlock``'s ``layers.N``, Qwen3-VL's ``deepstack_merger_list.N``, local experts): each entry is a shard
of it. A trainable-only save keeps the trainable entries only, and megatron-core's save refuses a tensor whose
shards do not cover it (measured with Bridge 0.6.2 / megatron-core 0.19.2, both optimizers, at the run's first
save: ``CheckpointingException: Invalid sharding pattern validation ... Invalid access pattern for
ShardedTensor(key='vision_model.decoder.deepstack_merger_list.patch_norm.weight' ...``). A selection that trains
some entries of such a list and not the others (a pattern on one layer) is therefore refused when the base is
loaded, before anything trains, naming the stacked tensors. Read on the raw model: each shard's ``data`` is the
parameter itself (``state_dict(keep_vars=True)``), so ``requires_grad`` says what trains, by identity.
"""

from __future__ import annotations

from typing import Any

from bridge_freeze_plugin.errors import TrainableOnlyCheckpointError, some_of
from bridge_freeze_plugin.prewrap import as_chunks, provider_label


def partly_trained(model: Any) -> list[str]:
    """The checkpoint keys of stacked tensors some of whose shards train and some not, on this rank."""
    trains: dict[str, set[bool]] = {}
    for chunk in as_chunks(model):
        sharded = getattr(chunk, "sharded_state_dict", None)
        if not callable(sharded):
            continue
        for entry in sharded().values():
            key, data = getattr(entry, "key", None), getattr(entry, "data", None)
            flag = getattr(data, "requires_grad", None)
            if isinstance(key, str) and isinstance(flag, bool):
                trains.setdefault(key, set()).add(flag)
    return sorted(key for key, flags in trains.items() if len(flags) == 2)


def refuse_partly_trained(model: Any, provider: Any, field: str) -> None:
    found = partly_trained(model)
    if found:
        raise TrainableOnlyCheckpointError(
            f"{provider_label(provider)}: {field}=true, but this selection trains some entries of a stacked "
            f"tensor and not the others ({some_of(found, 6)}): megatron-core saves such a module list as one tensor, "
            "and refuses a save that holds only some of its entries (Invalid access pattern, at the first save). "
            "Train every entry of the list or none (adjust train_patterns / freeze_patterns), or set "
            f"{field}=false to save the whole model.")
