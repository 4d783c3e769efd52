"""Activation: Bridge's own provider classes honour the flags.

- :mod:`._activate`: :func:`activate` / :func:`deactivate` patch every registered family's provider classes in
  place (``provide()``, the flags as fields) and guard the rest of Bridge (uncovered providers, adapter exports,
  ``get_model``, ``setup_optimizer``); run on ``import bridge_freeze_plugin`` and by the autoload hook. The
  in-place class patches are :mod:`._class_patch`, the module-level functions routed or checked :mod:`._module_hooks`;
- :mod:`._saved_reads`: Bridge's ``instantiate`` marks a provider made from a saved config with its file;
- :mod:`._serialised`: Bridge's config serialiser leaves the plugin's unset fields out of ``run_config.yaml`` (a
  load without the plugin, STRICT included), and ``ConfigContainer.from_yaml`` marks the provider it loads;
- :mod:`._provider_fields`: the plugin's settings as real dataclass fields of every patched provider class;
- :mod:`.freezable`: the module path the previous version wrote as ``_target_`` for the generated freezable
  subclasses; it forwards to their home, :mod:`bridge_freeze_plugin.mixins` (the mixin for one's own providers).
"""

from bridge_freeze_plugin.activation._activate import (
    activate,
    autoload_activate,
    deactivate,
    is_active,
    patched_classes,
)
from bridge_freeze_plugin.activation._class_patch import patch_provider_class
from bridge_freeze_plugin.activation._provider_fields import FLAG_FIELDS, PLUGIN_FIELDS

__all__ = [
    "FLAG_FIELDS",
    "PLUGIN_FIELDS",
    "activate",
    "autoload_activate",
    "deactivate",
    "is_active",
    "patch_provider_class",
    "patched_classes",
]
