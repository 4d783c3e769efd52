"""What an RL trainer's weight-sync receiver needs to take only what trains (NeMo-RL, SkyRL).

:func:`~bridge_freeze_plugin.export.export_trainable_hf_weights` limits Bridge's HF export to the tensors that can
have changed. A receiver that is told the stream's layout beforehand has to be told that subset:

- :func:`trainable_hf_weights_info`: ``name -> (shape, dtype)`` of that stream, in its order (``everything=True``:
  the full export's). It is what NeMo-RL's ``prepare_refit_info`` returns and its vLLM receiver is prepared with
  (``state_dict_info``), computed the way NeMo-RL computes it: by running the export and keeping only the shapes.
- :func:`trainable_param_filter`: the ``param_filter`` of SkyRL's ``MegatronWeightSource`` (a predicate on a
  conversion task's ``global_param_name``), so that the source streams, and declares in its ``metadata()``,
  exactly ``export_trainable_hf_weights``'s tensors.
- :class:`FullThenTrainableSource`: one source object (vLLM's ``WeightSource`` contract: ``metadata()`` and
  iteration, which agree element for element) that serves a full source until one whole round of it has been
  sent, then a trainable one: the rule "first sync everything, then what trains" inside a trainer that builds
  one source for the whole run (SkyRL). See ``docs/rl-weight-sync.md`` for the wiring and when it is unsafe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from bridge_freeze_plugin.errors import TrainableSyncError
from bridge_freeze_plugin.export._sync import _describe, export_trainable_hf_weights, trainable_conversion_tasks

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

__all__ = ["FullThenTrainableSource", "trainable_hf_weights_info", "trainable_param_filter"]


def trainable_hf_weights_info(
    bridge: Any,
    model: Any,
    *,
    everything: bool = False,
    group: Any = None,
    **kwargs: Any,
) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """HF name -> ``(shape, dtype)`` of ``export_trainable_hf_weights(bridge, model, ...)``'s stream, in its order.

    ``everything=True``: of Bridge's full export (the first sync). The same ``kwargs`` as the export
    (``merge_adapter_weights``, ``weight_dtype``, ``conversion_tasks``; not ``cpu``): pass those the sync will use,
    or the receiver is prepared for another stream. Collective like the export, and as costly as one: Bridge has
    no shape-only export, so the stream is produced (on the devices, not copied to the CPU) and only the shapes
    are kept, one tensor at a time. Call it on every rank of the export, once per layout (not per step).
    """
    if "cpu" in kwargs:
        raise TrainableSyncError(
            f"trainable_hf_weights_info(cpu={kwargs['cpu']!r}) on {_describe(bridge)}: the layout does not depend "
            "on where the tensors are copied; leave cpu out"
        )
    kwargs.setdefault("show_progress", False)
    stream = export_trainable_hf_weights(bridge, model, cpu=False, everything=everything, group=group, **kwargs)
    info: dict[str, tuple[torch.Size, torch.dtype]] = {}
    for name, tensor in stream:
        if name in info:
            raise TrainableSyncError(
                f"the HF export of {_describe(bridge)} yields {name!r} twice: a receiver keyed by name cannot take "
                "this stream; report this model"
            )
        info[name] = (tensor.shape, tensor.dtype)
        del tensor
    return info


def trainable_param_filter(
    bridge: Any,
    model: Any,
    *,
    merge_lora: bool = True,
    group: Any = None,
) -> Callable[[str], bool]:
    """SkyRL's ``MegatronWeightSource(bridge, model, dtype, param_filter=...)``: the source then streams exactly
    ``export_trainable_hf_weights(bridge, model)``'s tensors (names, values, order; SkyRL casts them to its
    ``dtype``), and its ``metadata()`` declares exactly those.

    A predicate on a conversion task's ``global_param_name``, true for the tasks
    :func:`~bridge_freeze_plugin.export.trainable_conversion_tasks` keeps on this rank (positions are agreed
    across ranks there; the names are this rank's, which under expert parallelism differ between ranks: build
    the filter on every rank, for that rank's source). Collective. Build it again whenever what trains changes.

    ``merge_lora``: SkyRL's ``trainer.policy.megatron_config.lora_config.merge_lora``. With ``False`` SkyRL
    never uses this source: it sends the adapters alone (``MegatronLoraAdapterSource``), which is refused.
    """
    if not merge_lora:
        raise TrainableSyncError(
            f"a param_filter for {_describe(bridge)} with merge_lora=false: SkyRL then syncs the LoRA adapters "
            "alone (MegatronLoraAdapterSource), so no MegatronWeightSource runs, and a part that trains at full "
            "rank next to the adapters would never reach the engine (the plugin refuses Bridge's adapter export "
            "for such a run); set trainer.policy.megatron_config.lora_config.merge_lora=true"
        )
    built = list(bridge.get_conversion_tasks(model))
    kept = trainable_conversion_tasks(bridge, model, conversion_tasks=built, group=group)
    names = frozenset(task.global_param_name for task in kept)
    if any(task is None for task in built):
        # SkyRL's source reads task.global_param_name of every task once a filter is set
        raise TrainableSyncError(
            f"Bridge's conversion tasks for {_describe(bridge)} include placeholders (None) for parameters without "
            "a mapping: SkyRL 0.4.0's MegatronWeightSource would fail on them with a filter set; sync everything "
            "(no param_filter) and report this model"
        )
    logger.debug("SkyRL param_filter for %s: %d of %d conversion tasks", _describe(bridge), len(names), len(built))
    return names.__contains__


class FullThenTrainableSource:
    """A weight source (``metadata()`` and iteration) that is ``full`` until one round of it has been iterated to
    the end, and ``trainable`` from then on; :meth:`require_full` goes back to ``full`` for the next round.

    ``full`` and ``trainable``: sources of the same model, e.g. SkyRL's ``MegatronWeightSource(bridge, model,
    dtype)`` and ``MegatronWeightSource(bridge, model, dtype, param_filter=trainable_param_filter(bridge,
    model))``. ``metadata()`` always describes what the next iteration yields, so it suits an engine that reads
    the metadata for every round (it changes once, after the first round), not one that reads it once and keeps
    it. ``prepare=True`` (the default) reads both sources' metadata now: with SkyRL's sources that is two dry
    exports, collective, so build this on every rank at the same point (SkyRL's ``_build_weight_source`` is).

    Not for an engine that drops its weights between syncs (vLLM's sleep level 2, SkyRL's colocated default):
    there every sync must be full; give the engine ``full`` alone.
    """

    def __init__(self, full: Any, trainable: Any, *, prepare: bool = True) -> None:
        self._full = full
        self._trainable = trainable
        self._full_sent = False
        if prepare:
            full.metadata()
            trainable.metadata()

    @property
    def full_sync_pending(self) -> bool:
        """Whether the next round sends everything."""
        return not self._full_sent

    @property
    def current(self) -> Any:
        """The source the next round reads."""
        return self._trainable if self._full_sent else self._full

    def require_full(self) -> None:
        """The next round sends everything again: the engine restarted, woke from a sleep that dropped its
        weights, or the policy was reloaded from a checkpoint, or what trains changed."""
        self._full_sent = False

    def metadata(self) -> Any:
        return self.current.metadata()

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        source = self.current
        yield from source
        if source is self._full and not self._full_sent:
            self._full_sent = True
            logger.debug("full weight sync sent: the following rounds send what trains")
