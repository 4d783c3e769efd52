"""Plan a freeze before any GPU is involved: build the real Bridge model on the meta device and count.

``bridge-freeze plan`` uses this package: :mod:`.model_choice` says which model (MODEL + ``--tiny`` /
``--hf-config``), :mod:`.config_checks` checks a ``config.json`` before anything is built, :mod:`.meta_build`
builds the model on PyTorch's meta device with the selection applied by the plugin's own freeze, and
:mod:`.estimate` turns the per-parameter records into per-part counts and the weight, gradient-buffer and
optimizer-state bytes a training run holds and freezing saves; :mod:`.layout`, :mod:`.per_rank` and
:mod:`.activations` give what each GPU holds under a parallel layout (real per-rank builds) and an
activation estimate per micro-batch; :mod:`.offline_configs` reads remote-code configs offline.
"""

from __future__ import annotations

from bridge_freeze_plugin.errors import PlanError
from bridge_freeze_plugin.planning.config_checks import DEFAULT_MAX_LAYER_BLOCKS
from bridge_freeze_plugin.planning.estimate import (
    DTYPE_BYTES,
    OPTIMIZERS,
    SCHEMA_VERSION,
    MemoryAssumptions,
    ParamInfo,
    Plan,
    PlanPart,
    make_plan,
)
from bridge_freeze_plugin.planning.layout import Layout
from bridge_freeze_plugin.planning.meta_build import build_meta_model, plan_model
from bridge_freeze_plugin.planning.model_choice import (
    config_file,
    hf_config_provider,
    load_hf_config,
    resolve_model,
    tiny_provider,
)
from bridge_freeze_plugin.planning.per_rank import ActivationSettings, RankFigures

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
    "build_meta_model",
    "config_file",
    "hf_config_provider",
    "load_hf_config",
    "make_plan",
    "plan_model",
    "resolve_model",
    "tiny_provider",
]
