"""Mixins: the provider mixin and the freezable subclasses of existing providers. One of the design's two homes
(the other is :mod:`bridge_freeze_plugin.registry`).

- :mod:`.freezable`: :class:`FreezableVLMProvider` (put it first among a Bridge provider dataclass's bases),
  :func:`make_freezable` (an existing provider, e.g. from ``AutoBridge.to_megatron_provider()``, made freezable in
  place) and :func:`freezable_class`; the generated freezable subclasses live there under public names, so a
  provider pickles and survives Bridge's ``run_config.yaml`` (``_target_: bridge_freeze_plugin.mixins.freezable.
  Freezable...``). Its name is public because Bridge writes it as ``_target_`` and refuses a private segment;
- :mod:`.generated`: the path earlier versions wrote (``bridge_freeze_plugin.mixins.generated.Freezable...``),
  forwarding to :mod:`.freezable` (as ``bridge_freeze_plugin.activation.freezable`` does for the last one).

What patches Bridge's own provider classes in place is :mod:`bridge_freeze_plugin.activation`.
"""

from typing import Any

from bridge_freeze_plugin.mixins import freezable as _freezable
from bridge_freeze_plugin.mixins.freezable import _PREFIX as GENERATED_CLASS_PREFIX
from bridge_freeze_plugin.mixins.freezable import (
    ALLOWED_TARGET_PREFIXES,
    FORMER_MODULES,
    FreezableVLMProvider,
    allow_targets,
    disallow_targets,
    freezable_class,
    make_freezable,
)
from bridge_freeze_plugin.mixins.freezable import _decode as decode_class_path
from bridge_freeze_plugin.mixins.freezable import _encode as encode_class_path
from bridge_freeze_plugin.mixins.freezable import class_name as generated_class_name

#: The module that holds the generated freezable subclasses (``_target_: <this>.Freezable...`` in a run config).
GENERATED_MODULE = _freezable.__name__


def __getattr__(name: str) -> Any:
    """A generated freezable subclass by its name (what a former module path forwards here)."""
    if name.startswith(GENERATED_CLASS_PREFIX):
        return getattr(_freezable, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "ALLOWED_TARGET_PREFIXES",
    "FORMER_MODULES",
    "GENERATED_CLASS_PREFIX",
    "GENERATED_MODULE",
    "FreezableVLMProvider",
    "allow_targets",
    "decode_class_path",
    "disallow_targets",
    "encode_class_path",
    "freezable_class",
    "generated_class_name",
    "make_freezable",
]
