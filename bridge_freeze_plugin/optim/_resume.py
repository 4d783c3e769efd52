"""Per-part learning rates through a checkpoint load: each group gets back its own saved state, then is checked.

A resume loads the optimizer's saved parameter groups and pairs each with a current group by an identifier
tuple, megatron-core's ``param_group_identifier_keys``. megatron-core 0.18 (SkyRL's pin) identifies a group by
``wd_mult``, ``lr_mult``, ``is_expert_parallel`` and ``is_decoupled_lr`` only: two groups that differ only in
``max_lr`` / ``min_lr`` (a part with its own LR beside the global one) collapse into one, and every such current
group gets the last one's saved hyperparameters (``optimizer.py:_filter_and_reorder_param_groups``,
``distrib_optimizer.py``'s ``make_needed_groups``). The resumed run then trains a part at another part's LR, with
no error. megatron-core 0.19 adds the override keys to the identifier.

:func:`keep_part_groups_on_load` wraps one optimizer's ``load_state_dict`` and ``sharded_state_dict`` (0.18's
distributed optimizer pairs its own groups with themselves there, ``distrib_optimizer.py:1498``, before the load):
while they run, the identifier also holds the keys the plugin's overrides set (:data:`OVERRIDE_KEYS`; nothing
changes where megatron-core already has them), and after the load the groups are checked again, so a checkpoint
whose groups came back with other values is an error before the next step.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import Any

from bridge_freeze_plugin.prewrap import keeps

#: The parameter-group keys the plugin's per-part overrides set (``part_lr_overrides``).
OVERRIDE_KEYS = ("max_lr", "min_lr")
#: The megatron-core modules that read ``param_group_identifier_keys`` when a checkpoint's groups are paired.
IDENTIFIER_MODULES = ("megatron.core.optimizer.optimizer", "megatron.core.optimizer.distrib_optimizer")
_NAME = "param_group_identifier_keys"
_MARK = "__bridge_freeze_part_groups__"


def missing_identifier_keys() -> dict[str, tuple[str, ...]]:
    """Module -> the :data:`OVERRIDE_KEYS` its ``param_group_identifier_keys`` lacks (only modules that lack some)."""
    out: dict[str, tuple[str, ...]] = {}
    for name in IDENTIFIER_MODULES:
        keys = getattr(importlib.import_module(name), _NAME, None)
        if keys is not None:
            missing = tuple(k for k in OVERRIDE_KEYS if k not in keys)
            if missing:
                out[name] = missing
    return out


@contextlib.contextmanager
def _identified_by_override_keys() -> Iterator[None]:
    """While active, megatron-core pairs a checkpoint's parameter groups by :data:`OVERRIDE_KEYS` too."""
    patched: list[tuple[Any, tuple[str, ...]]] = []
    try:
        for name, missing in missing_identifier_keys().items():
            module = importlib.import_module(name)
            original = getattr(module, _NAME)
            setattr(module, _NAME, (*original, *missing))
            patched.append((module, original))
        yield
    finally:
        for module, original in reversed(patched):
            setattr(module, _NAME, original)


def keep_part_groups_on_load(optimizer: Any, check: Callable[[], Any]) -> None:
    """Wrap ``optimizer.load_state_dict`` and ``optimizer.sharded_state_dict`` (this instance; once): groups are
    paired by :data:`OVERRIDE_KEYS` too while they run; after a load, ``check()`` (raises when a group's LRs
    changed)."""
    for name in ("load_state_dict", "sharded_state_dict"):
        real = getattr(optimizer, name, None)
        if real is not None and not getattr(real, _MARK, False):
            setattr(optimizer, name, _paired_by_override_keys(real, check if name == "load_state_dict" else None))


def _paired_by_override_keys(real: Callable[..., Any], then: Callable[[], Any] | None) -> Callable[..., Any]:
    @keeps(real, mark=False)
    def call(*args: Any, **kwargs: Any) -> Any:
        with _identified_by_override_keys():
            result = real(*args, **kwargs)
        if then is not None:
            then()
        return result

    setattr(call, _MARK, True)
    return call
