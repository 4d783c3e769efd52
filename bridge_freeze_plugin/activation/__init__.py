"""Activation: Bridge's own provider classes honour the flags, and the provider mixin for one's own.

- :mod:`._activate`: :func:`activate` / :func:`deactivate` patch every registered family's provider classes in
  place (``provide()``, the flags as fields) and guard the rest of Bridge (uncovered providers, adapter exports,
  ``get_model``, ``setup_optimizer``); run on ``import bridge_freeze_plugin`` and by the autoload hook. The
  in-place class patches are :mod:`._class_patch`, the module-level functions routed or checked :mod:`._module_hooks`;
- :mod:`.freezable`: :class:`FreezableVLMProvider`, :func:`make_freezable`, and the generated freezable subclasses
  (importable by name, so a provider pickles and survives Bridge's ``run_config.yaml``). Its name is public
  because Bridge writes it as ``_target_`` and refuses a path with a private segment;
- :mod:`._saved_reads`: Bridge's ``instantiate`` marks a provider made from a saved config with its file;
- :mod:`._serialised`: Bridge's config serialiser leaves the plugin's unset fields out of ``run_config.yaml`` (a
  load without the plugin, STRICT included), and ``ConfigContainer.from_yaml`` marks the provider it loads;
- :mod:`._provider_fields`: the plugin's settings as real dataclass fields of every patched provider class.
"""

from bridge_freeze_plugin.activation import freezable as _freezable
from bridge_freeze_plugin.activation._activate import (
    activate,
    autoload_activate,
    deactivate,
    is_active,
    patched_classes,
)
from bridge_freeze_plugin.activation._class_patch import patch_provider_class
from bridge_freeze_plugin.activation._provider_fields import FLAG_FIELDS, PLUGIN_FIELDS
from bridge_freeze_plugin.activation.freezable import _PREFIX as GENERATED_CLASS_PREFIX
from bridge_freeze_plugin.activation.freezable import (
    ALLOWED_TARGET_PREFIXES,
    FreezableVLMProvider,
    freezable_class,
    make_freezable,
)
from bridge_freeze_plugin.activation.freezable import _decode as decode_class_path
from bridge_freeze_plugin.activation.freezable import _encode as encode_class_path
from bridge_freeze_plugin.activation.freezable import class_name as generated_class_name

#: The module that holds the generated freezable subclasses (``_target_: <this>.Freezable...`` in a run config).
GENERATED_MODULE = _freezable.__name__

__all__ = [
    "ALLOWED_TARGET_PREFIXES",
    "FLAG_FIELDS",
    "GENERATED_CLASS_PREFIX",
    "GENERATED_MODULE",
    "PLUGIN_FIELDS",
    "FreezableVLMProvider",
    "activate",
    "autoload_activate",
    "deactivate",
    "decode_class_path",
    "encode_class_path",
    "freezable_class",
    "generated_class_name",
    "is_active",
    "make_freezable",
    "patch_provider_class",
    "patched_classes",
]
