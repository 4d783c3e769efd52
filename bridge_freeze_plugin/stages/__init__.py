"""Stages: runs that continue from another run's checkpoint (issue 45).

- :mod:`._saved_selection`: the selection a checkpoint's ``run_config.yaml`` holds, and how it differs from a run's;
- :mod:`._resume_check`: a resume that loads optimizer state from a checkpoint saved with another selection is
  refused (:class:`~bridge_freeze_plugin.errors.SelectionChangedError`) before the load, on every rank; the seam,
  Bridge's ``_load_checkpoint_from_path``, is installed by ``activation``;
- :mod:`._check`: what a config's ``checkpoint`` section loads, read before anything is built, and whether its
  selection matches the checkpoint's (:func:`stage_check`, ``bridge-freeze check-config``'s stage line).

Imports ``request`` and ``prewrap`` (its faces) besides ``errors`` and ``ranks``.
"""

from bridge_freeze_plugin.stages._check import StageCheck, stage_check
from bridge_freeze_plugin.stages._resume_check import LOAD_FROM_PATH, check_saved_selection, checking_resume
from bridge_freeze_plugin.stages._saved_selection import Settings, changes, run_settings, saved_settings

__all__ = [
    "LOAD_FROM_PATH",
    "Settings",
    "StageCheck",
    "changes",
    "check_saved_selection",
    "checking_resume",
    "run_settings",
    "saved_settings",
    "stage_check",
]
