"""Where the previous version kept the mixin and the generated freezable subclasses: a ``run_config.yaml`` it wrote
names ``_target_: bridge_freeze_plugin.activation.freezable.Freezable<Provider>_x<encoded path>``. Every name
resolves through :mod:`bridge_freeze_plugin.mixins.freezable` (the same allowlist rules)."""

from typing import Any

from bridge_freeze_plugin import mixins as _home


def __getattr__(name: str) -> Any:
    return getattr(_home, name)
