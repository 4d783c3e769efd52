"""The pre-wrap build: what happens to a model between a provider's ``provide()`` and the DDP wrap.

Named after Bridge's own seam (``register_pre_wrap_hook``); not ``build/``, which tools treat as generated output.


- :mod:`._context`: the :class:`~._context.BuildContext`, computed once per build (family, selection, labels);
- :mod:`._pipeline`: ``provide()`` / ``provide_distributed_model()`` with the selection applied, per call and
  per thread;
- :mod:`._flags`: the flags as descriptors, read as ``False`` by Bridge's own ``provide()`` during a build;
- :mod:`._classify`: which part each parameter belongs to, by identity (wrappers and renames do not hide it);
- :mod:`._freeze`: the freeze itself (``requires_grad`` by part);
- :mod:`._running_stats`: a frozen part's BatchNorm-like modules keep their running statistics (eval-mode forward);
- :mod:`._model_names`: model-wide parameter names under pipeline / expert parallelism (what patterns match);
- :mod:`._hooks`: the pre-wrap hook chain (the plugin's freeze first, the guarantee last), for
  ``provide_distributed_model`` and Bridge's public ``get_model`` alike;
- :mod:`._lora`: LoRA with full-rank parts (restore, overlap check, ``params_to_save``);
- :mod:`._plain_linear`: LoRA adapters on plain ``torch.nn.Linear`` modules (no export carries them) refused;
- :mod:`._guarantee`: after every hook, what trains is exactly what was asked (a hook may narrow a trained part);
- :mod:`._recompute_fix`: full recompute where it breaks gradients, turned off there (private config copies);
- :mod:`._adapters`: what the plugin knows of Bridge's PEFT conventions;
- :mod:`._collective`: an error on one rank is an error on every rank;
- :mod:`._model_wide`: the model-wide report over tensor / pipeline / expert ranks (one ``all_reduce``);
- :mod:`._saved` and :mod:`._origins`: the saved configs this process read (and who listens to each read:
  ``stages``' resume check), and where each flag's value came from (this run's setting, the default, a saved
  config) for the report;
- :mod:`._provider`: the questions asked of a provider (its family, its flags, Bridge's own defaults);
- :mod:`._state`: the plugin's one mutable state (patch records, per-provider and per-chunk state);
- :mod:`._counting` and :mod:`._report`: parameters counted per part, and the :class:`FreezeReport`;
- :mod:`._wrapping`: :func:`keeps`, how the plugin wraps a Bridge / megatron-core function (all it had kept);
- :mod:`._recompute`: which parts full activation recompute concerns (the rule :mod:`._recompute_fix` applies).
"""

from bridge_freeze_plugin.prewrap._adapters import base_name
from bridge_freeze_plugin.prewrap._classify import Classifier, as_chunks, named_parameters
from bridge_freeze_plugin.prewrap._collective import agree_on_error
from bridge_freeze_plugin.prewrap._context import BuildContext
from bridge_freeze_plugin.prewrap._counting import PartCount, PartTally
from bridge_freeze_plugin.prewrap._flags import FlagField, with_flag_fields
from bridge_freeze_plugin.prewrap._freeze import PART_ATTR, apply_selection, expert_bias_moves, freeze_chunks
from bridge_freeze_plugin.prewrap._hooks import HookChain, model_wide_checks_skipped
from bridge_freeze_plugin.prewrap._lora import trainable_state_dict
from bridge_freeze_plugin.prewrap._model_names import model_wide_names
from bridge_freeze_plugin.prewrap._model_wide import last_report, ownership
from bridge_freeze_plugin.prewrap._origins import (
    INSTANTIATE,
    FlagOrigin,
    Source,
    flag_origins,
    instantiating,
    loading_container,
    reading_file,
)
from bridge_freeze_plugin.prewrap._pipeline import (
    add_training_build_check,
    get_model_frozen,
    preflight,
    provide_distributed_frozen,
    provide_frozen,
)
from bridge_freeze_plugin.prewrap._plain_linear import bridge_lora_wraps_plain_linear, linear_adapters
from bridge_freeze_plugin.prewrap._provider import (
    PLUGIN_CLASS_MARK,
    bridge_class,
    declared_default,
    flag_attributes,
    is_plugin_class,
    model_name_of,
    overridden_defaults,
    provider_label,
    resolve_family,
    write_selection,
)
from bridge_freeze_plugin.prewrap._recompute import affected_parts, full_recompute_adjustment, is_full
from bridge_freeze_plugin.prewrap._recompute_fix import FORMER_POLICY_ATTR, POLICIES, POLICY_ATTR
from bridge_freeze_plugin.prewrap._report import DefaultOverride, FreezeReport, log_report
from bridge_freeze_plugin.prewrap._running_stats import STATS_ATTR, stats_move, tracks_running_stats
from bridge_freeze_plugin.prewrap._saved import RUN_CONFIG_READERS, forget_saved, on_saved_read, recording
from bridge_freeze_plugin.prewrap._state import (
    MISSING,
    STATE,
    IdentityTable,
    TrainingBuild,
    chunk_state,
    on_training_build,
)
from bridge_freeze_plugin.prewrap._wrapping import CACHE_METHODS, keeps

__all__ = [
    "CACHE_METHODS",
    "FORMER_POLICY_ATTR",
    "INSTANTIATE",
    "MISSING",
    "PART_ATTR",
    "PLUGIN_CLASS_MARK",
    "POLICIES",
    "POLICY_ATTR",
    "RUN_CONFIG_READERS",
    "STATE",
    "STATS_ATTR",
    "BuildContext",
    "Classifier",
    "DefaultOverride",
    "FlagField",
    "FlagOrigin",
    "FreezeReport",
    "HookChain",
    "IdentityTable",
    "PartCount",
    "PartTally",
    "Source",
    "TrainingBuild",
    "add_training_build_check",
    "affected_parts",
    "agree_on_error",
    "apply_selection",
    "as_chunks",
    "base_name",
    "bridge_class",
    "bridge_lora_wraps_plain_linear",
    "chunk_state",
    "declared_default",
    "expert_bias_moves",
    "flag_attributes",
    "flag_origins",
    "forget_saved",
    "freeze_chunks",
    "full_recompute_adjustment",
    "get_model_frozen",
    "instantiating",
    "is_full",
    "is_plugin_class",
    "keeps",
    "last_report",
    "linear_adapters",
    "loading_container",
    "log_report",
    "model_name_of",
    "model_wide_checks_skipped",
    "model_wide_names",
    "named_parameters",
    "on_saved_read",
    "on_training_build",
    "overridden_defaults",
    "ownership",
    "preflight",
    "provide_distributed_frozen",
    "provide_frozen",
    "provider_label",
    "reading_file",
    "recording",
    "resolve_family",
    "stats_move",
    "tracks_running_stats",
    "trainable_state_dict",
    "with_flag_fields",
    "write_selection",
]
