"""The PEFT-shaped object that makes Bridge's checkpoints of a freeze run keep only what trains (issue 45 item 1).

A provider with ``save_trainable_only = True`` and no ``cfg.peft`` gets ``cfg.peft = TrainableOnlyPEFT()`` when
Bridge validates its config (:mod:`._trainable_checkpoint`). Bridge then treats the run as it treats a PEFT run,
with nothing of PEFT but its checkpoint conventions: ``setup()`` loads ``checkpoint.pretrained_checkpoint`` into
the raw model (the frozen base) before the plugin's selection is checked again, every checkpoint save keeps the
model tensors this object's ``params_to_save`` names (what trains, recorded by Bridge's ``set_params_to_save``
right after this object ran; the plugin adds its full-rank names as it does after LoRA), with the optimizer state,
scheduler, RNG and iteration, and a resume loads the base first, then the run's checkpoint with ``strict=False``.

It adds no adapter and freezes nothing: the plugin's selection, applied before it in the pre-wrap hook chain,
already says what trains. The module's name is public because Bridge writes the class's path into
``run_config.yaml`` as ``_target_`` and refuses a path with a private segment. The class is made on first
use (``bridge_freeze_plugin.stages.bridge.TrainableOnlyPEFT``, as Bridge's ``instantiate`` and pickle look it up),
because it derives from Bridge's PEFT base: importing this module imports no Bridge.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

_NAME = "TrainableOnlyPEFT"
#: The class attribute that tells it (and a subclass) apart without importing Bridge.
MARK = "__bridge_freeze_trainable_only_peft__"
_LOCK = threading.Lock()


def _make() -> type:
    from megatron.bridge.peft.base import PEFT

    @dataclass
    class TrainableOnlyPEFT(PEFT):  # type: ignore[misc]
        """Bridge's PEFT conventions (base from ``pretrained_checkpoint``, checkpoints of ``params_to_save``)
        without adapters: ``transform`` returns each module as it is, ``freeze_model`` leaves ``requires_grad``
        alone."""

        def transform(self, module: Any, name: str | None = None, prefix: str | None = None) -> Any:
            return module

        def freeze_model(self, model: Any, training: bool = True) -> None:
            """Nothing to freeze: the plugin's selection ran before this object (``__call__`` sets the train mode)."""

        def adapter_key_filter(self, key: Any) -> bool:
            """A checkpoint key is kept when it names a trainable tensor (``params_to_save``): no adapters."""
            if isinstance(key, tuple):  # Bridge's distributed-checkpoint form: (name, tensor)
                return bool(key[1].requires_grad)
            return key in self.params_to_save

    TrainableOnlyPEFT.__qualname__ = _NAME
    setattr(TrainableOnlyPEFT, MARK, True)
    return TrainableOnlyPEFT


def __getattr__(name: str) -> Any:
    """``TrainableOnlyPEFT``, made (importing Bridge's PEFT base) on first use."""
    if name != _NAME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _LOCK:
        if _NAME not in globals():
            globals()[_NAME] = _make()
    return globals()[_NAME]
