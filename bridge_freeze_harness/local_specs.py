"""Swap TransformerEngine layer specs and classes for megatron-core's local ones while building.

Several Bridge VLM providers and models name TransformerEngine specs or classes directly
(``get_gpt_layer_with_transformer_engine_spec``, ``TENorm``, ``TEColumnParallelLinear`` ...).
Without CUDA those cannot be instantiated. Inside :func:`cpu_build_patches` every loaded module
under ``megatron.bridge.models`` sees the local (pure PyTorch) equivalents instead, and
``torch.cuda.current_device`` answers ``"cpu"`` (rotary embeddings ask it for a device).

Module names and structure stay the real ones, which is what the plugin classifies; the layer
implementations are megatron-core's local ones (see :mod:`bridge_freeze_harness`). A family's own
any-size patches are its module's ``cpu_patches()`` (:mod:`bridge_freeze_harness.tiny`).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any


def _filtered(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Call ``fn`` with only the keyword arguments it accepts (TE and local getters differ)."""
    params = inspect.signature(fn).parameters

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **{k: v for k, v in kwargs.items() if k in params})

    call.__name__ = f"local_{fn.__name__}"
    return call


def _replacements() -> dict[str, Any]:
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.models.vision import vit_layer_specs
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    gpt_local = _filtered(gpt_layer_specs.get_gpt_layer_local_spec)
    gpt_local_sub = _filtered(gpt_layer_specs.get_gpt_layer_local_submodules)
    return {
        "get_gpt_layer_with_transformer_engine_spec": gpt_local,
        "get_gpt_layer_with_transformer_engine_submodules": gpt_local_sub,
        "get_vit_layer_with_transformer_engine_spec": vit_layer_specs.get_vit_layer_with_local_spec,
        "TENorm": WrappedTorchNorm,
        "TEColumnParallelLinear": ColumnParallelLinear,
        "TERowParallelLinear": RowParallelLinear,
    }


def _cpu_device() -> str:
    return "cpu"


@contextlib.contextmanager
def cpu_build_patches() -> Iterator[None]:
    """Patch TE names in every loaded ``megatron.bridge.models`` module; undo on exit."""
    import torch

    replacements = _replacements()
    undo: list[tuple[Any, str, Any]] = []
    for mod_name, module in list(sys.modules.items()):
        if module is None or not mod_name.startswith("megatron.bridge.models"):
            continue
        namespace = vars(module)
        for name, replacement in replacements.items():
            if name in namespace:
                undo.append((module, name, namespace[name]))
                setattr(module, name, replacement)
    # megatron.bridge.peft.utils decides "TE is here" from megatron-core's TE extension module, which
    # imports without TE (its classes are placeholders); LoRA then isinstance-checks against them.
    peft_utils = sys.modules.get("megatron.bridge.peft.utils")
    if peft_utils is not None and getattr(peft_utils, "HAVE_TE", False):
        undo.append((peft_utils, "HAVE_TE", True))
        peft_utils.HAVE_TE = False
    # A provider with a non-"auto" attention backend writes NVTE_* variables that megatron-core then
    # asserts on in every later build of the process: each build starts from none of them.
    nvte = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN", *(f"NVTE_FLASH_ATTN_V{v}" for v in (2, 3, 4)))
    saved_env = {name: os.environ.pop(name, None) for name in nvte}
    undo.append((torch.cuda, "current_device", torch.cuda.current_device))
    torch.cuda.current_device = _cpu_device  # type: ignore[assignment]
    try:
        yield
    finally:
        for module, name, original in reversed(undo):
            setattr(module, name, original)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
