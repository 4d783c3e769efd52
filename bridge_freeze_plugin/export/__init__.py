"""Export: what leaves the trainer, with the selection honoured.

- :mod:`._sync`: the RL weight sync of only what trains (:func:`export_trainable_hf_weights`, Bridge's HF export
  limited to the HF tensors that can have changed);
- :mod:`._signature`: calls into Bridge that pass only the keywords the installed Bridge takes
  (:func:`call_accepted`, :func:`accepts`);
- :mod:`._adapters`: Bridge's adapter-only exports refused for a LoRA run with full-rank parts (:data:`GUARDS`,
  installed by activation), which would silently drop the full-rank weights;
- :mod:`._receivers`: what a trainer's weight-sync receiver needs to take only what trains
  (:func:`trainable_hf_weights_info` for NeMo-RL's ``state_dict_info``, :func:`trainable_param_filter` for SkyRL's
  ``MegatronWeightSource``, :class:`FullThenTrainableSource`: a full first sync, then what trains, in one source);
- :mod:`._skyrl_guard`: the SkyRL runs whose engine drops its weights before each sync, refused for a
  trainable-only sync (:func:`require_engine_keeps_weights`).
"""

from bridge_freeze_plugin.export._adapters import (
    AUTO_BRIDGE,
    GUARDS,
    full_rank_parts_of_checkpoint,
    full_rank_parts_of_model,
)
from bridge_freeze_plugin.export._receivers import (
    FullThenTrainableSource,
    trainable_hf_weights_info,
    trainable_param_filter,
)
from bridge_freeze_plugin.export._signature import accepts, bridge_version, call_accepted
from bridge_freeze_plugin.export._skyrl_guard import require_engine_keeps_weights
from bridge_freeze_plugin.export._sync import export_trainable_hf_weights, trainable_conversion_tasks

__all__ = [
    "AUTO_BRIDGE",
    "GUARDS",
    "FullThenTrainableSource",
    "accepts",
    "bridge_version",
    "call_accepted",
    "export_trainable_hf_weights",
    "full_rank_parts_of_checkpoint",
    "full_rank_parts_of_model",
    "require_engine_keeps_weights",
    "trainable_conversion_tasks",
    "trainable_hf_weights_info",
    "trainable_param_filter",
]
