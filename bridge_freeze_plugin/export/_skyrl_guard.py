"""The SkyRL runs where a trainable-only weight sync has nothing to update: refused before the workers are built.

SkyRL 0.4.0's Megatron worker sees only ``cfg.trainer`` (its ``self.cfg``), so the worker subclass of
docs/rl-weight-sync.md (``FreezePolicyWorker``) can return SkyRL's full source under ``colocate_all`` (vLLM sleeps at
level 2 before each training phase: every sync is full), but cannot see the generator's settings. With
``generator.inference_engine.offload_kv_for_weight_sync=true`` SkyRL's ``WorkerDispatch`` puts the engine to sleep
before every sync (a synchronous trainer: ``sleep()``, level 2, which discards the weights; then it wakes the weights
and broadcasts into them), so a sync of only what trains would leave every frozen tensor of the engine without its
value. :func:`require_engine_keeps_weights` reads SkyRL's whole config, in the entry point, where it is known.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bridge_freeze_plugin.errors import TrainableSyncError

#: SkyRL's setting that sleeps the engine before each weight sync, as a dotted key of its SkyRLTrainConfig
OFFLOAD_KEY = "generator.inference_engine.offload_kv_for_weight_sync"


def _get(cfg: Any, dotted: str) -> Any:
    node = cfg
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else getattr(node, part, None)
        if node is None:
            return None
    return node


def require_engine_keeps_weights(cfg: Any) -> None:
    """Refuse a trainable-only sync for a SkyRL run whose engine drops its weights before each sync.

    ``cfg``: SkyRL's whole config (``SkyRLTrainConfig``, or a mapping / DictConfig of it), as its entry point has it
    before it builds the workers. Raises :class:`TrainableSyncError` when
    ``generator.inference_engine.offload_kv_for_weight_sync`` is true.
    """
    if _get(cfg, OFFLOAD_KEY) is True:
        model = _get(cfg, "trainer.policy.model.path") or "the policy"
        raise TrainableSyncError(
            f"a trainable-only weight sync (FreezePolicyWorker: everything once, then what trains) was asked for "
            f"{model} with {OFFLOAD_KEY}=true: SkyRL then puts the inference engine to sleep before every weight "
            "sync and wakes its weights with nothing in them (WorkerDispatch; level-2 sleep for a synchronous "
            "trainer), so every frozen tensor would be missing in the engine after the first sync. Set "
            f"{OFFLOAD_KEY}=false to keep the trainable-only sync, or leave SkyRL's PolicyWorker in place (every "
            "sync full)"
        )
