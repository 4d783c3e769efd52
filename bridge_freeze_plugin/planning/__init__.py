"""Plan a freeze before any GPU is involved: build the real Bridge model on the meta device and count.

``bridge-freeze plan`` uses this package: :mod:`._model_choice` says which model (MODEL + ``--tiny`` /
``--hf-config``), :mod:`._config_checks` checks a ``config.json`` before anything is built, :mod:`._meta_build`
builds the model on PyTorch's meta device with the selection applied by the plugin's own freeze, and
:mod:`._estimate` turns the per-parameter records into per-part counts and the weight, gradient-buffer and
optimizer-state bytes a training run holds and freezing saves (:mod:`._save_size`: the bytes of one checkpoint
save, full and trainable-only); :mod:`._layout`, :mod:`._per_rank` and
:mod:`._activations` give what each GPU holds under a parallel layout (real per-rank builds) and an
activation estimate per micro-batch; :mod:`._offline_configs` reads remote-code configs offline; :mod:`._sync_bytes`
and :mod:`._sync_layout` size an RL weight sync.
"""

from __future__ import annotations

from bridge_freeze_plugin.errors import PlanError
from bridge_freeze_plugin.planning._config_checks import DEFAULT_MAX_LAYER_BLOCKS
from bridge_freeze_plugin.planning._estimate import (
    DTYPE_BYTES,
    OPTIMIZERS,
    SCHEMA_VERSION,
    MemoryAssumptions,
    ParamInfo,
    Plan,
    PlanPart,
    make_plan,
)
from bridge_freeze_plugin.planning._layout import Layout
from bridge_freeze_plugin.planning._meta_build import build_meta_model, plan_model
from bridge_freeze_plugin.planning._model_choice import (
    config_file,
    hf_config_provider,
    load_hf_config,
    resolve_model,
    tiny_provider,
)
from bridge_freeze_plugin.planning._per_rank import ActivationSettings, RankFigures
from bridge_freeze_plugin.planning._save_size import SaveBytes, SaveSize, save_lines, save_size
from bridge_freeze_plugin.planning._sync_bytes import describe as describe_sync

__all__ = [
    "DEFAULT_MAX_LAYER_BLOCKS",
    "DTYPE_BYTES",
    "OPTIMIZERS",
    "SCHEMA_VERSION",
    "ActivationSettings",
    "Layout",
    "MemoryAssumptions",
    "ParamInfo",
    "Plan",
    "PlanError",
    "PlanPart",
    "RankFigures",
    "SaveBytes",
    "SaveSize",
    "build_meta_model",
    "config_file",
    "describe_sync",
    "hf_config_provider",
    "load_hf_config",
    "make_plan",
    "plan_model",
    "resolve_model",
    "save_lines",
    "save_size",
    "tiny_provider",
]
