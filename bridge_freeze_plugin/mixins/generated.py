"""Where versions before the one-module mixin kept the generated freezable subclasses: a ``run_config.yaml`` they
wrote names ``_target_: bridge_freeze_plugin.mixins.generated.Freezable<Provider>_x<encoded path>``. Every name
resolves through :mod:`bridge_freeze_plugin.mixins.freezable` (the same allowlist rules)."""

from typing import Any

from bridge_freeze_plugin.mixins import freezable as _home


def __getattr__(name: str) -> Any:
    return getattr(_home, name)
