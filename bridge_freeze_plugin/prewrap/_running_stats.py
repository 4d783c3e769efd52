"""A frozen part's running statistics stay as loaded: its BatchNorm-like modules run in eval mode.

``requires_grad=False`` stops gradients, not a module's forward-time state. A BatchNorm (or an InstanceNorm with
``track_running_stats``) in train mode updates ``running_mean`` / ``running_var`` / ``num_batches_tracked`` at
every forward, gradient or not: a "frozen" encoder that holds one (Nemotron Omni's conformer sound encoder) would
drift at every step, and Bridge's export, which maps those buffers, would write the drifted statistics.

The freeze marks each such module (:data:`STATS_ATTR`) with whether its part is frozen, and installs, once per
module, a forward pre-hook that runs the module's forward in eval mode while the mark is set (the module's
``training`` flag is restored right after, by a forward hook that runs even if the forward raises). Nothing
depends on ``model.train()`` / ``model.eval()`` calls, so it holds through Bridge's own ``model.train()`` calls,
Float16Module and the DDP wrap (hooks live on the module itself), activation recompute (the re-run forward is
hooked the same way) and checkpoints (the state dict is untouched; a new build marks the modules again). A part
that trains is marked ``False`` and its statistics move as in any training; freezing again re-marks (the freeze is
idempotent). The hooks are module-level functions: a hooked model still pickles and deep-copies.

Which modules: :func:`tracks_running_stats` (torch's ``_NormBase`` family with ``track_running_stats``, or any module
holding a ``running_mean`` buffer and a ``momentum``); the test ``tests/unit/prewrap/test_running_stats.py`` scans
every family's tiny build for any buffer a forward moves, so a new family with another kind is caught there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

#: Set on each running-statistics module by the freeze: ``True`` while its part is frozen.
STATS_ATTR = "bridge_freeze_frozen_stats"
#: Set on a module once its two hooks are installed.
_HOOKED = "_bridge_freeze_stats_hooked"
#: Set by the pre-hook while a forward runs in eval mode in place of train mode.
_FLIPPED = "_bridge_freeze_stats_flipped"


def tracks_running_stats(module: Any) -> bool:
    """Whether ``module``'s forward in train mode updates running statistics (BatchNorm-like)."""
    from torch.nn.modules.batchnorm import _NormBase

    if isinstance(module, _NormBase):
        return bool(module.track_running_stats) and getattr(module, "running_mean", None) is not None
    buffers = dict(module.named_buffers(recurse=False)) if hasattr(module, "named_buffers") else {}
    return "running_mean" in buffers and hasattr(module, "momentum")


def stats_modules(chunk: Any) -> Iterator[tuple[str, Any]]:
    """``(name, module)`` of every running-statistics module of one chunk."""
    for name, module in chunk.named_modules():
        if tracks_running_stats(module):
            yield name, module


def _eval_forward(module: Any, _args: Any) -> None:
    if getattr(module, STATS_ATTR, False) and module.training:
        module.training = False
        module.__dict__[_FLIPPED] = True


def _restore_mode(module: Any, _args: Any, _output: Any) -> None:
    if module.__dict__.pop(_FLIPPED, False):
        module.training = True


def keep_frozen_stats(chunks: list[Any], frozen: Callable[[str, Any], bool | None]) -> int:
    """Mark every running-statistics module of ``chunks`` by ``frozen(name, module)`` (``None``: not governed by
    the selection, left as it is); install the hooks once. Returns how many are kept in eval mode."""
    kept = 0
    for chunk in chunks:
        for name, module in stats_modules(chunk):
            decision = frozen(name, module)
            if decision is None:
                continue
            setattr(module, STATS_ATTR, decision)
            kept += decision
            if decision and not getattr(module, _HOOKED, False):
                module.register_forward_pre_hook(_eval_forward)
                module.register_forward_hook(_restore_mode, always_call=True)
                setattr(module, _HOOKED, True)
    return kept


def stats_move(module: Any) -> bool:
    """Whether a forward in train mode moves ``module``'s running statistics (a stats module not kept frozen)."""
    return tracks_running_stats(module) and not getattr(module, STATS_ATTR, False)
