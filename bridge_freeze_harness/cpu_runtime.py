"""Bring up just enough of Megatron's runtime on a CPU-only machine to build real Bridge models.

What a real training job gets from ``torchrun`` + NCCL + ``model_parallel_cuda_manual_seed`` is
replaced here by: a gloo process group on the loopback interface, megatron-core's model-parallel
state, and an RNG tracker whose forks use the CPU generator.

Who imports it, and why: :mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
from collections.abc import Iterator
from types import ModuleType

from bridge_freeze_harness import _te_stub

#: Provider fields with no CPU implementation (TransformerEngine / apex fusions): off for any CPU or meta build.
CPU_FUSIONS_OFF: dict[str, bool] = {
    "gradient_accumulation_fusion": False,
    "bias_activation_fusion": False,
    "bias_dropout_fusion": False,
    "masked_softmax_fusion": False,
    "persist_layer_norm": False,
    "apply_rope_fusion": False,
}


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def import_bridge() -> ModuleType:
    """``import megatron.bridge`` on any machine (with the TE stub where TE cannot load)."""
    _te_stub.install()
    # megatron-core first, outside any stub window, so it records HAVE_TE=False (its TE extension too).
    importlib.import_module("megatron.core")
    _te_stub.te_placeholders_as_types()
    return importlib.import_module("megatron.bridge")


def init_cpu_distributed(
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    virtual_pipeline_model_parallel_size: int | None = None,
    expert_model_parallel_size: int = 1,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    seed: int = 1234,
) -> None:
    """Initialise gloo + megatron model-parallel state + a CPU RNG tracker (idempotent).

    Single-process callers need no arguments. Multi-process callers pass ``rank``/``world_size``
    and set ``MASTER_ADDR``/``MASTER_PORT`` themselves (to a loopback address).
    """
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as mpu_random

    if not dist.is_initialized():
        rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        world_size = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
        if world_size == 1:
            # A private loopback port, not written to the environment: child processes (CLI tests)
            # must not inherit a MASTER_PORT this process is already listening on.
            dist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
            )
        else:
            if "MASTER_PORT" not in os.environ:
                raise RuntimeError("multi-process CPU runs must set MASTER_PORT for every rank")
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            dist.init_process_group("gloo", rank=rank, world_size=world_size)

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tensor_model_parallel_size,
            pipeline_model_parallel_size=pipeline_model_parallel_size,
            virtual_pipeline_model_parallel_size=virtual_pipeline_model_parallel_size,
            expert_model_parallel_size=expert_model_parallel_size,
        )

    # model_parallel_cuda_manual_seed needs a CUDA driver. The "inference" tracker has the same
    # interface and forks nothing, so dropout regions draw from the (seeded) CPU generator.
    mpu_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    torch.manual_seed(seed)


def destroy_cpu_distributed() -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def cpu_distributed(**kwargs: int) -> Iterator[None]:
    init_cpu_distributed(**kwargs)
    try:
        yield
    finally:
        destroy_cpu_distributed()


#: Megatron-core keeps some training state per process, as module or class attributes: the auxiliary-loss scalers
#: keep the first loss scale set and ``copy_`` every later one into it (a ``[]`` scale left by one run cannot take a
#: later ``[1]``: "output with shape [] doesn't match the broadcast shape [1]"), and the MoE metrics tracker sizes
#: each metric by the first model's layer count (a later, deeper model: "index 2 is out of bounds"). A job builds
#: one model; a test process builds many. Each forward / training in the harness starts from a fresh process's state.
_LOSS_SCALERS = (
    ("megatron.core.transformer.moe.moe_utils", "MoEAuxLossAutoScaler"),
    ("megatron.core.transformer.multi_token_prediction", "MTPLossAutoScaler"),
    ("megatron.core.transformer.experimental_attention_variant.dsa", "DSAIndexerLossAutoScaler"),
)
_MOE_METRICS = "megatron.core.transformer.moe.moe_logging"
#: ``get_rerun_state_machine()`` creates the process's rerun state machine when none is set (a loss function of a
#: forward outside ``pretrain()`` calls it), and Bridge's ``initialize_megatron`` then refuses to set its own:
#: "Rerun state machine is already initialized" (a CI run, after a forward-step test on the same worker).
_RERUN = "megatron.core.rerun_state_machine"


def fresh_training_state() -> None:
    """Megatron-core's per-process training state as a fresh process has it (a module not imported yet has it)."""
    import sys

    for module_name, class_name in _LOSS_SCALERS:
        scaler = getattr(sys.modules.get(module_name), class_name, None)
        if scaler is not None and hasattr(scaler, "main_loss_backward_scale"):
            scaler.main_loss_backward_scale = None
    destroy = getattr(sys.modules.get(_MOE_METRICS), "destroy_moe_metrics_tracker", None)
    if destroy is not None:
        destroy()
    destroy_rerun = getattr(sys.modules.get(_RERUN), "destroy_rerun_state_machine", None)
    if destroy_rerun is not None:
        destroy_rerun()
