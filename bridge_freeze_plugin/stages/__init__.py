"""Stages: runs that continue from another run's checkpoint (issue 45).

- :mod:`._saved_selection`: the selection a checkpoint's ``run_config.yaml`` holds, and how it differs from a run's;
- :mod:`._resume_check`: a resume that loads optimizer state from a checkpoint saved with another selection is
  refused (:class:`~bridge_freeze_plugin.errors.SelectionChangedError`) before the load, on every rank; the seam,
  Bridge's ``_load_checkpoint_from_path``, is installed by ``activation``;
- :mod:`._check`: what a config's ``checkpoint`` section loads, read before anything is built, and whether its
  selection matches the checkpoint's (:func:`stage_check`, ``bridge-freeze check-config``'s stage line);
- :mod:`._trainable_checkpoint` and :mod:`._base_record`: checkpoints of what trains (the provider's
  ``save_trainable_only``): Bridge's PEFT seams for a freeze run, the frozen base recorded in each such checkpoint
  and checked on every load of it; :mod:`.bridge` holds ``TrainableOnlyPEFT`` (a public module: Bridge writes its
  path into ``run_config.yaml``; not imported here: the class derives from Bridge's PEFT base, made on first use).

Imports ``request`` and ``prewrap`` (its faces) besides ``errors`` and ``ranks``.
"""

from bridge_freeze_plugin.stages._base_record import SIDECAR, BaseRecord, SavedRecord, fingerprint
from bridge_freeze_plugin.stages._check import StageCheck, stage_check
from bridge_freeze_plugin.stages._resume_check import LOAD_FROM_PATH, check_saved_selection, checking_resume
from bridge_freeze_plugin.stages._saved_selection import Settings, changes, run_settings, saved_settings
from bridge_freeze_plugin.stages._trainable_checkpoint import (
    CHECKPOINTING,
    CONFIG_CONTAINER,
    install_checkpoint_steps,
    install_config_step,
    is_trainable_only_peft,
    prepare_config,
    saved_record,
    trainable_only,
)

__all__ = [
    "CHECKPOINTING",
    "CONFIG_CONTAINER",
    "LOAD_FROM_PATH",
    "SIDECAR",
    "BaseRecord",
    "SavedRecord",
    "Settings",
    "StageCheck",
    "changes",
    "check_saved_selection",
    "checking_resume",
    "fingerprint",
    "install_checkpoint_steps",
    "install_config_step",
    "is_trainable_only_peft",
    "prepare_config",
    "run_settings",
    "saved_record",
    "saved_settings",
    "stage_check",
    "trainable_only",
]
