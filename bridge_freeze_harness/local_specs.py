"""Swap TransformerEngine layer specs and classes for megatron-core's local ones while building.

Several Bridge VLM providers and models name TransformerEngine specs or classes directly
(``get_gpt_layer_with_transformer_engine_spec``, ``TENorm``, ``TEColumnParallelLinear`` ...).
Without TransformerEngine those cannot be instantiated. Inside :func:`local_spec_patches` every loaded module
under ``megatron.bridge.models`` sees the local (pure PyTorch) equivalents instead (on a CPU, and on a GPU
machine without TE); :func:`cpu_build_patches` adds the CPU device patch: ``torch.cuda.current_device``
answers ``"cpu"`` (rotary embeddings ask it for a device). That patch must never run on CUDA.

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

from bridge_freeze_harness.patching import patched


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
    """:func:`local_spec_patches` plus the CPU device patch (``torch.cuda.current_device`` answers ``"cpu"``).

    Only for a CPU or meta build: on CUDA use :func:`local_spec_patches` alone
    (:func:`bridge_freeze_harness.context.device_build_context`).
    """
    import torch

    with local_spec_patches(), patched([(torch.cuda, "current_device", _cpu_device)]):
        yield


@contextlib.contextmanager
def local_spec_patches() -> Iterator[None]:
    """Patch TE names in every loaded ``megatron.bridge.models`` module; undo on exit. No device patch."""
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
    try:
        with zero_centred_torch_norms():
            yield
    finally:
        for module, name, original in reversed(undo):
            setattr(module, name, original)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def zero_centred_torch_norms() -> Iterator[None]:
    """megatron-core's torch norm accepts a zero-centred-gamma config while building.

    Without TransformerEngine every norm of a local spec (and a decoder's ``final_layernorm``) is megatron-core's
    ``WrappedTorchNorm``, which refuses ``layernorm_zero_centered_gamma`` (an assertion). Published configs
    that Bridge converts with zero-centred gamma (Qwen3.5, MiniMax-M3, Step-3.7, any other) then cannot build:
    so every CPU build gets this (:func:`cpu_build_patches`). While building, such a config gets
    :class:`~bridge_freeze_harness.local_layers.Norm` instead (the same ``weight`` / ``bias`` parameters, the
    zero-centred gamma applied); every other config gets the torch norm as before.
    """
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from bridge_freeze_harness.local_layers import Norm

    original = WrappedTorchNorm.__dict__["__new__"]
    torch_new = WrappedTorchNorm.__new__

    def new(cls: type, config: Any, hidden_size: int, eps: float = 1e-5, *args: Any, **kwargs: Any) -> Any:
        if getattr(config, "layernorm_zero_centered_gamma", False):
            return Norm(config=config, hidden_size=hidden_size, eps=eps)
        return torch_new(cls, config, hidden_size, eps, *args, **kwargs)

    WrappedTorchNorm.__new__ = new  # type: ignore[method-assign]
    try:
        yield
    finally:
        WrappedTorchNorm.__new__ = original  # type: ignore[method-assign]
