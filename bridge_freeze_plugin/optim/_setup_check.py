"""Bridge's ``setup()`` checks the per-part learning rates it built, with no code from the user.

Bridge 0.6.2 has no hook between building the optimizer and training. While the plugin is active, Bridge's
``setup_optimizer`` (``megatron.bridge.training.optim``, and the name ``megatron.bridge.training.setup``
imported) runs as before and then, when the optimizer-override provider is a
:class:`~bridge_freeze_plugin.optim.bridge.PartLROverrideProvider`, :func:`verify_part_learning_rates` on
what it built: a per-part learning rate the optimizer did not apply is an error before the first step.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from bridge_freeze_plugin.prewrap import keeps
from bridge_freeze_plugin.ranks import is_rank0

logger = logging.getLogger("bridge_freeze_plugin")

#: The Bridge modules that hold ``setup_optimizer`` (defined in the first, imported by name in the second).
MODULES = ("megatron.bridge.training.optim", "megatron.bridge.training.setup")
NAME = "setup_optimizer"


def checked(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (Bridge's ``setup_optimizer``), then the per-part learning-rate check on its result."""
    signature = inspect.signature(original)

    @keeps(original)
    def setup_optimizer(*args: Any, **kwargs: Any) -> Any:
        from bridge_freeze_plugin.optim._verify import verify_part_learning_rates
        from bridge_freeze_plugin.optim.bridge import PartLROverrideProvider

        result = original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        provider = bound.arguments.get("optimizer_config_override_provider")
        if isinstance(provider, PartLROverrideProvider):
            optimizer, scheduler = result
            applied = verify_part_learning_rates(optimizer, bound.arguments["model"], provider.rates(),
                                                 optimizer_config=bound.arguments.get("optimizer_config"),
                                                 scheduler=scheduler)
            if is_rank0():  # the per-part learning rates, once, next to the freeze report
                logger.info("bridge-freeze: per-part learning rates applied: %s", ", ".join(
                    f"{part} {peak:g} (min {low:g})" for part, (peak, low) in sorted(applied.items())))
        return result

    return setup_optimizer
