"""Bring up Megatron's runtime on ONE CUDA device, and choose the layer specs a CUDA build uses.

What a training job gets from ``torchrun``: an NCCL process group (world 1 here: one process, device 0),
megatron-core's model-parallel state and ``model_parallel_cuda_manual_seed``. Nothing of the CPU runtime
(:mod:`.cpu_runtime`: gloo, the CPU RNG tracker) and never the CPU device patch.

Specs. Where TransformerEngine imports, a CUDA build uses Bridge's own (TE) specs, untouched. Where it does not
(the lent GPU machine has no TE: its wheels cannot travel), Bridge's VLM providers still name TE specs
unconditionally (``TESpecProvider()`` is ``None`` there), so the build needs the harness's TE-to-local
replacements (:func:`bridge_freeze_harness.local_specs.local_spec_patches`), without the device patch.
:func:`spec_choice` says which, and :func:`announce_specs` logs it once (the GPU tests print it too).

Who imports it, and why: :mod:`bridge_freeze_harness` (the package docstring).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any, Literal

from bridge_freeze_harness._te_stub import real_transformer_engine_available

logger = logging.getLogger(__name__)

SpecChoice = Literal["transformer_engine", "local"]
_ANNOUNCED: list[SpecChoice] = []


def spec_choice() -> SpecChoice:
    """``"transformer_engine"`` when TE imports here (Bridge's own specs), else ``"local"`` (the swap)."""
    return "transformer_engine" if real_transformer_engine_available() else "local"


def announce_specs() -> SpecChoice:
    """:func:`spec_choice`, logged once per process (WARNING for the local swap: a GPU run's output says so)."""
    choice = spec_choice()
    if not _ANNOUNCED:
        _ANNOUNCED.append(choice)
        if choice == "local":
            logger.warning("CUDA build: TransformerEngine is not importable; megatron-core's local specs "
                           "replace Bridge's TE specs")
        else:
            logger.info("CUDA build: TransformerEngine imports; Bridge's own (TE) specs")
    return choice


def require_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("a CUDA build was asked for on a machine without CUDA; use device='cpu'")


def init_gpu_distributed(seed: int = 1234) -> None:
    """NCCL world 1 on device 0 + model-parallel state (TP = PP = 1) + megatron-core's CUDA RNG tracker.

    Idempotent. A process group that is already up (any backend, any size) is kept, as is model-parallel
    state: a caller that launched several ranks has set them up itself.
    """
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from bridge_freeze_harness.cpu_runtime import free_port

    require_cuda()
    if not dist.is_initialized():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
            dist.init_process_group("nccl")  # torchrun's environment
        else:
            dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(seed)
    torch.manual_seed(seed)


@contextlib.contextmanager
def plugin_collectives_forced(ranks: int = 2) -> Iterator[list[tuple[str, str]]]:
    """The plugin's modules (only them) told the process group has ``ranks`` ranks; every ``all_reduce`` recorded.

    With one GPU the NCCL world has one rank, where the plugin skips its collectives (nothing to agree on). Inside,
    ``torch.distributed.get_world_size`` answers ``ranks`` to a caller in ``bridge_freeze_plugin`` (Megatron and
    Bridge keep the truth), so the plugin runs them and each ``all_reduce`` really goes through the group's backend
    with the tensor on the device the plugin chose; over one rank a sum leaves it unchanged. Yields the list of
    ``(tensor device type, backend)`` of every ``all_reduce`` issued inside. Test support only.
    """
    import torch.distributed as dist

    calls: list[tuple[str, str]] = []
    real_size, real_reduce = dist.get_world_size, dist.all_reduce

    def size(group: Any = None) -> int:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        return ranks if caller.startswith("bridge_freeze_plugin") else real_size(group)

    def recording(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append((tensor.device.type, str(dist.get_backend(kwargs.get("group")))))
        return real_reduce(tensor, *args, **kwargs)

    dist.get_world_size, dist.all_reduce = size, recording
    try:
        yield calls
    finally:
        dist.get_world_size, dist.all_reduce = real_size, real_reduce
