"""Provider mixins: :class:`FreezableVLMProvider`, and :func:`make_freezable` for existing providers."""

from bridge_freeze_plugin.mixins.freezable import FreezableVLMProvider, make_freezable
from bridge_freeze_plugin.mixins.generated import freezable_class
from bridge_freeze_plugin.prewrap import declared_default, overridden_defaults, write_selection

__all__ = [
    "FreezableVLMProvider",
    "declared_default",
    "freezable_class",
    "make_freezable",
    "overridden_defaults",
    "write_selection",
]
